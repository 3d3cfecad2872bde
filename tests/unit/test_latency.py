"""Latency EWMAs: the arithmetic, freshness on the injected clock, the observer hook."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from policies.latency import LatencyStats


def test_first_sample_is_taken_as_is_then_ewma():
    stats = LatencyStats(FakeClock(), alpha=0.5)
    assert stats.estimate("a") == (None, None)
    stats.observe_ttft("a", 1.0)
    assert stats.estimate("a") == (1.0, None)
    stats.observe_ttft("a", 0.0)
    assert stats.estimate("a")[0] == pytest.approx(0.5)
    stats.observe_ttft("a", 0.5)
    assert stats.estimate("a")[0] == pytest.approx(0.5)
    assert stats.estimate("b") == (None, None)  # per label


def test_time_per_token_from_token_counts():
    stats = LatencyStats(FakeClock(), alpha=0.2)
    stats.observe_tokens("a", 100, 2.0)  # 20 ms per token
    stats.observe_tokens("a", 0, 5.0)  # no tokens: no sample
    stats.observe_tokens("a", 10, -1.0)  # nonsense: no sample
    assert stats.estimate("a") == (None, pytest.approx(0.02))
    stats.observe_tokens("a", 10, 0.7)  # 70 ms per token
    assert stats.estimate("a")[1] == pytest.approx(0.2 * 0.07 + 0.8 * 0.02)


def test_stale_estimates_are_forgotten():
    clock = FakeClock()
    stats = LatencyStats(clock, alpha=0.5, max_age_s=60)
    stats.observe_ttft("a", 4.0)
    clock.advance(60)
    assert stats.estimate("a")[0] == 4.0
    clock.advance(0.1)
    assert stats.estimate("a") == (None, None)
    stats.observe_ttft("a", 0.2)  # a fresh start, not averaged with the stale 4.0
    assert stats.estimate("a")[0] == 0.2


def test_observer_hook_records_successful_attempts_only():
    stats = LatencyStats(FakeClock(), alpha=1.0)
    stats.attempt_started("a")
    stats.attempt_finished("a", error="UpstreamTimeoutError", ttft_s=None, retryable=False)
    stats.attempt_finished("a", error="UpstreamServerError", ttft_s=9.0, retryable=False)
    assert stats.estimate("a") == (None, None)
    stats.attempt_finished("a", error=None, ttft_s=0.3, retryable=False)
    assert stats.estimate("a") == (0.3, None)


def test_alpha_must_be_a_fraction():
    with pytest.raises(ValueError):
        LatencyStats(FakeClock(), alpha=0)
    with pytest.raises(ValueError):
        LatencyStats(FakeClock(), alpha=1.5)


@given(st.lists(st.floats(0, 100), min_size=1, max_size=50), st.floats(0.01, 1))
def test_ewma_stays_within_the_samples(samples, alpha):
    stats = LatencyStats(FakeClock(), alpha=alpha)
    for sample in samples:
        stats.observe_ttft("a", sample)
    ttft = stats.estimate("a")[0]
    assert min(samples) - 1e-9 <= ttft <= max(samples) + 1e-9
