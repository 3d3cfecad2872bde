"""Prices: exact figures for known cases, and invariants against exact rational arithmetic."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.config_tenants import Price
from policies.pricing import cost_usd, estimate_cost

GPT4O = Price(input_per_mtok=2.5, output_per_mtok=10.0, cached_input_per_mtok=1.25)
MINI = Price(input_per_mtok=0.15, output_per_mtok=0.6, cached_input_per_mtok=0.075)


def test_no_price_costs_nothing():
    assert cost_usd(None, 1_000_000, 1_000_000, 10) == 0.0
    assert estimate_cost(None, 5_000, 4_096) == 0.0


def test_input_and_output_tokens_are_billed_at_their_rates():
    assert cost_usd(GPT4O, 1000, 500) == 0.0075
    assert cost_usd(GPT4O, 1_000_000, 0) == 2.5
    assert cost_usd(GPT4O, 0, 1_000_000) == 10.0
    assert cost_usd(MINI, 2_000_000, 1_000_000) == 0.9


def test_cached_tokens_are_part_of_the_prompt_and_billed_at_the_cached_rate():
    # 1000 prompt tokens of which 800 cached: 200 * 2.5 + 800 * 1.25 + 100 * 10 per million.
    assert cost_usd(GPT4O, 1000, 100, 800) == 0.0025
    assert cost_usd(GPT4O, 1000, 100, 800) < cost_usd(GPT4O, 1000, 100, 0)


def test_cached_rate_defaults_to_the_input_rate():
    price = Price(input_per_mtok=3.0, output_per_mtok=15.0)
    assert cost_usd(price, 1000, 0, 1000) == cost_usd(price, 1000, 0, 0) == 0.003


def test_cached_count_above_the_prompt_is_clamped_and_negatives_count_as_zero():
    assert cost_usd(GPT4O, 100, 0, 500) == cost_usd(GPT4O, 100, 0, 100) == 0.000125
    assert cost_usd(GPT4O, -5, -5, -5) == 0.0
    assert cost_usd(GPT4O, 1000, -5) == 0.0025


def test_missing_rates_are_free():
    assert cost_usd(Price(output_per_mtok=8.0), 1_000_000, 1000) == 0.008
    assert cost_usd(Price(input_per_mtok=8.0), 1000, 1_000_000) == 0.008


def test_hourly_price_charges_every_token_at_hourly_over_throughput():
    # 3.60 USD/hour at 1000 tokens/s: 3.6 / 3.6e6 = 1e-6 USD per token.
    local = Price(hourly_usd=3.6, tokens_per_s=1000.0)
    assert cost_usd(local, 700, 300) == pytest.approx(1e-3, rel=1e-15)
    assert cost_usd(local, 700, 300, 700) == cost_usd(local, 700, 300)
    assert cost_usd(local, 700, 300) == local.per_token()[0] * 1000


def test_estimate_is_the_uncached_worst_case():
    assert estimate_cost(GPT4O, 1000, 500) == 0.0075
    assert estimate_cost(GPT4O, 1000, 500) == cost_usd(GPT4O, 1000, 500, 0)


def test_estimate_covers_a_cached_rate_above_the_input_rate():
    odd = Price(input_per_mtok=1.0, output_per_mtok=1.0, cached_input_per_mtok=4.0)
    assert estimate_cost(odd, 1000, 0) == cost_usd(odd, 1000, 0, 1000) == 0.004


rates = st.one_of(st.none(), st.integers(0, 100_000).map(lambda c: c / 1000))
tokens = st.integers(0, 10_000_000)


def exact(price: Price, prompt: int, completion: int, cached: int) -> Fraction:
    """The cost in exact rational arithmetic from the decimal prices as written."""
    cached = min(cached, prompt)
    rate_in = Fraction(str(price.input_per_mtok or 0.0))
    rate_out = Fraction(str(price.output_per_mtok or 0.0))
    rate_cached = (
        rate_in
        if price.cached_input_per_mtok is None
        else Fraction(str(price.cached_input_per_mtok))
    )
    return ((prompt - cached) * rate_in + cached * rate_cached + completion * rate_out) / 10**6


@given(rates, rates, rates, tokens, tokens, tokens)
def test_cost_matches_exact_arithmetic(rate_in, rate_out, rate_cached, prompt, completion, cached):
    price = Price(
        input_per_mtok=rate_in, output_per_mtok=rate_out, cached_input_per_mtok=rate_cached
    )
    expected = exact(price, prompt, completion, cached)
    got = cost_usd(price, prompt, completion, cached)
    assert abs(Fraction(got) - expected) <= expected * Fraction(1, 10**12)


@given(rates, rates, rates, tokens, tokens, tokens, tokens)
def test_estimate_bounds_every_usage_within_the_reservation(
    rate_in, rate_out, rate_cached, prompt, max_out, completion, cached
):
    price = Price(
        input_per_mtok=rate_in, output_per_mtok=rate_out, cached_input_per_mtok=rate_cached
    )
    completion = min(completion, max_out)
    assert cost_usd(price, prompt, completion, cached) <= estimate_cost(price, prompt, max_out)


@given(tokens, tokens, tokens, st.integers(1, 10_000))
def test_more_tokens_never_cost_less(prompt, completion, cached, extra):
    assert cost_usd(MINI, prompt + extra, completion, cached) >= cost_usd(
        MINI, prompt, completion, cached
    )
    assert cost_usd(MINI, prompt, completion + extra, cached) > cost_usd(
        MINI, prompt, completion, cached
    )
