"""What cut attempts say about a target's queue (decision 0010, session 24)."""

from __future__ import annotations

import pytest

from core.clock import FakeClock
from policies.latency import CUT_ERROR, LatencyStats

PROMPT = 100


def _box() -> tuple[FakeClock, LatencyStats]:
    """A 4-slot box as the gateway learns it: quick answers (0.25 s, a log spread ~0.4) at
    0-3 in flight, and at 4 in flight only the lucky answers that found a slot free."""
    clock = FakeClock()
    stats = LatencyStats(clock, prior_tokens=0)
    for i in range(40):
        stats.observe_ttft("box", (0.15, 0.35)[i // 4 % 2], prompt_tokens=PROMPT, in_flight=i % 4)
        clock.advance(0.2)
    for _ in range(3):
        stats.observe_ttft("box", 0.25, prompt_tokens=PROMPT, in_flight=4)
        clock.advance(0.2)
    return clock, stats


def _cut(clock: FakeClock, stats: LatencyStats, waited_s: float, in_flight: int) -> None:
    clock.advance(waited_s)
    stats.attempt_finished(
        "box",
        error=CUT_ERROR,
        ttft_s=waited_s,
        retryable=False,
        prompt_tokens=PROMPT,
        in_flight=in_flight,
        ticket=stats.attempt_started("box", prompt_tokens=PROMPT, in_flight=in_flight),
    )
    # an answer at the least-loaded band between cuts: no penalty ever runs
    stats.observe_ttft("box", 0.25, prompt_tokens=PROMPT, in_flight=0)


def test_cuts_above_the_least_loaded_band_teach_the_curve_its_queue_not_the_fits():
    """Answers alone read the full box as idle at 4 in flight; its cuts there (each one
    ordinary: well inside the p99 as predicted) are censored samples of that band, so the
    curve learns the queue, and the no-load fit does not take the waits as its own."""
    clock, stats = _box()
    assert stats.health("box", 4).ttft_load_factor == 1.0
    base = stats.ttft_model("box")
    assert base is not None
    factors = []
    for _ in range(8):
        _cut(clock, stats, 0.5, in_flight=4)
        assert stats.health("box").ttft_penalty == 1.0  # ordinary cuts, no penalty
        factors.append(stats.health("box", 4).ttft_load_factor)
    assert factors == sorted(factors) and factors[-1] > 1.5
    assert stats.health("box", 2).ttft_load_factor == 1.0  # the bands below are untouched
    after = stats.ttft_model("box")
    assert after is not None and after.predict(PROMPT) == pytest.approx(
        base.predict(PROMPT), rel=0.05
    )


def test_cuts_at_the_least_loaded_band_are_censored_samples_of_the_fits():
    clock, stats = _box()
    base = stats.ttft_model("box")
    assert base is not None
    curve = stats.health("box", 4).ttft_load_factor
    clock.advance(0.5)
    stats.attempt_finished(
        "box", error=CUT_ERROR, ttft_s=0.5, retryable=False, prompt_tokens=PROMPT, in_flight=0
    )
    after = stats.ttft_model("box")
    assert after is not None and after.predict(PROMPT) > base.predict(PROMPT)
    assert stats.health("box", 4).ttft_load_factor == curve
