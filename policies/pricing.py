"""What a request costs, from a target's ``Price`` and the token counts of its usage.

Pure arithmetic, no I/O. Token counts follow OpenAI's usage object: ``cached_tokens`` are a
part of ``prompt_tokens`` (``prompt_tokens_details.cached_tokens``), billed at the cached
input rate instead of the input rate. A target without a price costs 0.0.

Per-token prices are given per million tokens; the sum is taken in "USD x 1e6" and divided
once, so e.g. 1,000 input tokens at 2.5 USD/Mtok and 500 output tokens at 10 USD/Mtok come
out as exactly ``0.0075`` (one rounding, not three). Hourly prices (local targets) charge
every token, input or output, ``hourly_usd / (tokens_per_s * 3600)``.
"""

from __future__ import annotations

from core.config_tenants import Price


def _clamp(tokens: int) -> int:
    # Usage comes from upstreams; a negative count is their bug and must not earn a credit.
    return max(0, int(tokens))


def cost_usd(
    price: Price | None, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> float:
    """USD for one request's usage. ``cached_tokens`` (clamped to ``prompt_tokens``) are
    billed at ``cached_input_per_mtok`` (default: the input rate), the other prompt tokens
    at ``input_per_mtok``, completion tokens at ``output_per_mtok``. Negative counts count
    as 0. ``price`` None -> 0.0."""
    if price is None:
        return 0.0
    prompt = _clamp(prompt_tokens)
    completion = _clamp(completion_tokens)
    cached = min(_clamp(cached_tokens), prompt)
    if price.hourly_usd is not None and price.tokens_per_s:
        # One division over the whole product keeps the result to a single rounding.
        return (prompt + completion) * price.hourly_usd / (price.tokens_per_s * 3600.0)
    input_rate = price.input_per_mtok or 0.0
    output_rate = price.output_per_mtok or 0.0
    cached_rate = price.cached_input_per_mtok
    if cached_rate is None or cached_rate == input_rate:
        # One product, not two: the cost must not depend on how many tokens were cached
        # when the rates are the same (else a reservation could fall short by an ulp).
        micro = prompt * input_rate + completion * output_rate
    else:
        micro = (prompt - cached) * input_rate + cached * cached_rate + completion * output_rate
    return micro / 1e6


def estimate_cost(price: Price | None, prompt_tokens: int, max_output_tokens: int) -> float:
    """An upper bound for a quota reservation before the call: ``max_output_tokens``
    completion tokens and every prompt token at the higher of the input and cached-input
    rates (no cache discount is assumed). Never below what ``cost_usd`` later charges for
    usage within those bounds (cost is linear in the cached count, so the worst case is
    none or all of the prompt cached)."""
    uncached = cost_usd(price, prompt_tokens, max_output_tokens, 0)
    all_cached = cost_usd(price, prompt_tokens, max_output_tokens, prompt_tokens)
    return max(uncached, all_cached)
