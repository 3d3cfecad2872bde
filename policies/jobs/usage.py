"""A batch item's token usage, read from its answer, and the batch's running totals.

OpenAI's ``Batch.usage`` counts the tokens of the batch's requests in the Responses API's
names (``input_tokens``, ``output_tokens``, their details). An item's answer carries the
endpoint's own usage object: chat and legacy completions and embeddings say
``prompt_tokens``/``completion_tokens``, the Responses API ``input_tokens``/
``output_tokens``. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct

from policies.jobs.objects import BatchUsage, InputTokensDetails, OutputTokensDetails


class ItemUsage(Struct, frozen=True):
    """One answer's tokens (all zero when it had no usage: an error, a refusal)."""

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0


NO_USAGE = ItemUsage()
_any = msgspec.json.Decoder(dict[str, Any])


def _count(value: Any) -> int:
    # Counts come from upstreams: anything but a non-negative integer counts as 0.
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _nested(usage: dict[str, Any], outer: str, key: str) -> int:
    inner = usage.get(outer)
    return _count(inner.get(key)) if isinstance(inner, dict) else 0


def item_usage(body: bytes) -> ItemUsage:
    """The usage in an item's JSON answer; zeros when there is none or it is not JSON."""
    try:
        usage = _any.decode(body).get("usage")
    except msgspec.DecodeError:
        return ItemUsage()
    if not isinstance(usage, dict):
        return ItemUsage()
    return ItemUsage(
        input_tokens=_count(usage.get("input_tokens", usage.get("prompt_tokens"))),
        cached_tokens=_nested(usage, "input_tokens_details", "cached_tokens")
        or _nested(usage, "prompt_tokens_details", "cached_tokens"),
        output_tokens=_count(usage.get("output_tokens", usage.get("completion_tokens"))),
        reasoning_tokens=_nested(usage, "output_tokens_details", "reasoning_tokens")
        or _nested(usage, "completion_tokens_details", "reasoning_tokens"),
    )


def requested_model(body: bytes) -> str | None:
    """The ``model`` an item's request body names (the alias), or None."""
    try:
        model = _any.decode(body).get("model")
    except msgspec.DecodeError:
        return None
    return model if isinstance(model, str) and model else None


def batch_usage(input_tokens: int, cached: int, output_tokens: int, reasoning: int) -> BatchUsage:
    """``Batch.usage`` from the store's totals."""
    return BatchUsage(
        input_tokens=input_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=cached),
        output_tokens=output_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning),
        total_tokens=input_tokens + output_tokens,
    )
