"""vLLM's request fields beyond OpenAI's, read from a client's JSON body.

The JAX worker reads them from each request's body, the in-process provider from the body
the client sent to the gateway (``CallContext.raw_body``). ``decode_body`` is the shared way
to read a body: a malformed or invalid one is a 400 naming the field, as vLLM answers.
"""

from __future__ import annotations

import re
from typing import TypeVar

import msgspec
from msgspec import Struct

from core.errors import InvalidRequestError
from core.wire import Int64
from local_tier.jax.api import SamplingParams

T = TypeVar("T")


class VllmExtensions(Struct):
    """vLLM's request fields beyond OpenAI's that the local engine honours, with vLLM's names
    and defaults (docs/local_tier_jax.md). ``priority``: lower runs first (vLLM's
    ``--scheduling-policy priority``); the gateway sends batch items at 1. The sampling
    fields are checked by the engine, before anything runs (400 naming the field)."""

    priority: Int64 = 0
    ignore_eos: bool = False
    min_tokens: Int64 = 0
    stop_token_ids: list[Int64] | None = None
    repetition_penalty: float | None = None  # None = 1.0 (off)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def apply(self, params: SamplingParams) -> SamplingParams:
        """``params`` with these fields set (stop_token_ids de-duplicated, as vLLM)."""
        penalty = self.repetition_penalty
        return msgspec.structs.replace(
            params,
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            stop_token_ids=tuple(dict.fromkeys(self.stop_token_ids or ())),
            repetition_penalty=1.0 if penalty is None else penalty,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
        )


_FIELD = re.compile(r"at `\$\.(\w+)")  # msgspec names the path: "... - at `$.temperature`"


def decode_body(body: bytes, kind: type[T]) -> T:
    """Decode a JSON body; a malformed or invalid one is a 400 naming the field."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        found = _FIELD.search(str(exc))
        raise InvalidRequestError(str(exc), param=found and found.group(1)) from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequestError(f"Invalid JSON body: {exc}") from exc


def vllm_extensions(body: bytes | None) -> VllmExtensions:
    """vLLM's extension fields of a client's JSON body; the defaults without a body."""
    return decode_body(body, VllmExtensions) if body else VllmExtensions()
