"""One request's life in the engine, apart from the step loop: the checks before it runs,
and its output side (sampling state, detokenizer, stop rules, the outputs it streams).

The step loop (``engine.py``) owns the scheduler and the device; it hands each sampled token
to ``RequestState.push`` and finishes the request when that says the output ended.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field

import numpy as np

from local_tier.jax.api import (
    EngineRequestError,
    GenerationOutput,
    GenerationRequest,
    SamplingParams,
)
from local_tier.jax.detokenizer import IncrementalDetokenizer, StopFilter
from local_tier.jax.device_sampling import END_WIDTH, RowState, row_key
from local_tier.jax.sampling import check_params
from local_tier.jax.scheduler import Sequence
from local_tier.jax.tokenizer import Tokenizer


@dataclass(eq=False)
class RequestState:
    """Per-request state owned by the step loop."""

    seq: Sequence
    params: SamplingParams
    key: np.ndarray  # the request's sampling key data (device_sampling.row_key)
    ban_ids: tuple[int, ...]  # ids banned while below min_tokens: EOS and stop_token_ids
    detok: IncrementalDetokenizer
    stops: StopFilter
    end_ids: frozenset[int]  # tokens that end the output: EOS (unless ignored), stop_token_ids
    out: asyncio.Queue[GenerationOutput] = field(default_factory=asyncio.Queue)
    pending_ids: list[int] = field(default_factory=list)  # sampled, text still held back
    done: bool = False

    @classmethod
    def new(
        cls, seq: Sequence, p: SamplingParams, tokenizer: Tokenizer, rng: np.random.Generator
    ) -> RequestState:
        """The sampling key, detokenizer and stop rules of one request (vLLM's semantics);
        ``rng`` draws the key of a request without a seed."""
        eos = frozenset(tokenizer.eos_token_ids)
        stop_ids = frozenset(p.stop_token_ids)
        decode = functools.partial(tokenizer.decode, skip_special_tokens=p.skip_special_tokens)
        return cls(
            seq,
            p,
            row_key(p.seed, rng),
            # min_tokens holds back EOS even under ignore_eos, as vLLM's all_stop_token_ids.
            tuple(sorted(eos | stop_ids)),
            IncrementalDetokenizer(decode),
            StopFilter(p.stop, include=p.include_stop_str_in_output),
            stop_ids if p.ignore_eos else eos | stop_ids,
        )

    def row_state(self) -> RowState:
        """The request's row in a step's sampling arrays (its state before the next token)."""
        p, seq = self.params, self.seq
        return RowState(
            p,
            self.key,
            num_generated=len(seq.output_ids),
            end_ids=self.ban_ids if p.min_tokens > 0 else (),
            seen_ids=seq.all_ids if p.repetition_penalty != 1.0 else (),
        )

    def push(self, token: int) -> tuple[str | None, str]:
        """Take ``token`` (already in ``seq.output_ids``): (finish reason or None, the text
        to stream now). vLLM's rules: an end token's text is left out unless
        include_stop_str_in_output; stop strings are searched only in the text of tokens
        after the first min_tokens. A token whose text is held back waits in
        ``pending_ids`` for the next output."""
        seq, p, reason = self.seq, self.params, None
        check = len(seq.output_ids) > p.min_tokens
        if token in self.end_ids:  # min_tokens masked these while it mattered
            reason = "stop"
            text = (
                self.stops.push(self.detok.push([token]), check)
                if p.include_stop_str_in_output
                else ""
            )
            text += self.stops.push(self.detok.flush(), check)
        else:
            text = self.stops.push(self.detok.push([token]), check)
            if self.stops.stopped:
                reason = "stop"
            elif len(seq.output_ids) >= seq.max_tokens:
                reason, text = "length", text + self.stops.push(self.detok.flush(), check)
        if reason is not None:
            text += self.stops.flush()
        return reason, text

    def output(self, text: str, ids: list[int], reason: str | None) -> GenerationOutput:
        """The next streamed item: ``text`` and ``ids`` after any held-back token ids."""
        held, self.pending_ids = self.pending_ids, []
        seq = self.seq
        return GenerationOutput(
            text=text,
            token_ids=held + ids,
            finish_reason=reason,
            prompt_tokens=len(seq.prompt_ids),
            completion_tokens=len(seq.output_ids),
            cached_tokens=seq.num_cached,
            scheduled_at=seq.first_scheduled,
        )


def validate(req: GenerationRequest, vocab: int, limit: int, eos: frozenset[int]) -> int:
    """Raise ``EngineRequestError`` for a request that can never run within ``limit`` tokens
    of context (the model's and the cache's); return its max_tokens."""
    p, n = req.params, len(req.prompt_token_ids)
    if p.min_tokens > 0 and len(eos | set(p.stop_token_ids)) > END_WIDTH:
        raise EngineRequestError(
            f"with min_tokens, stop_token_ids and the model's EOS ids may hold at most "
            f"{END_WIDTH} ids together",
            "stop_token_ids",
        )
    if n == 0:
        raise EngineRequestError("the prompt is empty", "prompt")
    if any(not 0 <= t < vocab for t in req.prompt_token_ids):
        raise EngineRequestError(f"prompt token ids must be in [0, {vocab})", "prompt")
    check_params(p, vocab)
    if n >= limit:
        raise EngineRequestError(
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"has {n} tokens, which leaves no room for the completion.",
            "messages",
            code="context_length_exceeded",
        )
    if p.max_tokens is None:
        if p.min_tokens > limit - n:  # vLLM compares with the default max_tokens too
            raise EngineRequestError(
                f"min_tokens must be <= max_tokens={limit - n}, got {p.min_tokens}",
                "min_tokens",
            )
        return limit - n
    if n + p.max_tokens > limit:
        raise EngineRequestError(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{n + p.max_tokens} tokens ({n} in the prompt, {p.max_tokens} for the "
            f"completion). Please reduce the prompt or max_tokens.",
            "max_tokens",
            code="context_length_exceeded",
        )
    return p.max_tokens
