"""What cut attempts say about a target's queue, and how ``slo`` ranks a target whose
queue lies beyond what its samples saw (decision 0010, session 24)."""

from __future__ import annotations

import copy
import random

import msgspec
import pytest

from core.clock import FakeClock
from core.config_tenants import Price
from core.protocols import Timeouts
from core.routing import RouteRequest, TargetHealth
from policies.latency import CUT_ERROR, LatencyStats
from routers.strategies.slo import Slo
from routers.targets import Target

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
    curve learns the queue; the no-load fit takes the first ones, until the curve reads
    the slow-down, and then no more."""
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
        base.predict(PROMPT), rel=0.1
    )
    fits = copy.deepcopy((stats.fits.fast["box"], stats.fits.slow["box"]))
    clock.advance(0.5)  # read slowed there now: a cut there leaves the fits alone
    stats.attempt_finished(
        "box", error=CUT_ERROR, ttft_s=0.5, retryable=False, prompt_tokens=PROMPT, in_flight=4
    )
    assert (stats.fits.fast["box"], stats.fits.slow["box"]) == fits


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


def _tgt(name: str, price: float) -> Target:
    return Target(
        alias="alias",
        provider_name=name,
        model="m",
        provider=None,  # type: ignore[arg-type]  # planning never calls it
        timeouts=Timeouts(),
        price=Price(input_per_mtok=price, output_per_mtok=price),
    )


class _Health:
    def __init__(self, **by_provider: TargetHealth) -> None:
        self.by_label = {f"{name}/m": h for name, h in by_provider.items()}

    def health(self, label: str) -> TargetHealth:
        return self.by_label.get(label, TargetHealth())


def test_with_nothing_feasible_a_load_beyond_what_was_seen_ranks_after_a_seen_one():
    """Start-up, nothing meets 800 ms at its tail: the box at 12 in flight (its samples
    saw 5) reads x1.76 and a slightly lower chance of being late than premium; that
    chance extrapolates a queue, so premium goes first. Premium past what its own
    samples saw, at no slow-down, is no queue. Once the box's load is one its samples
    saw, or it reads no slow-down, the chance decides again."""
    chat = RouteRequest(model="alias", prompt_tokens=133, slo_ttft_ms=800)
    premium = TargetHealth(
        ttft_s=0.54, ttft_spread=0.5, ttft_age_s=0.0, in_flight=5, ttft_load_seen=3
    )
    box = TargetHealth(
        ttft_s=0.27,
        ttft_spread=0.5,
        ttft_age_s=0.0,
        in_flight=12,
        ttft_load_factor=1.76,
        ttft_load_seen=5,
    )
    candidates = [_tgt("premium", 5.0), _tgt("box", 0.05)]

    def order(local: TargetHealth) -> list[str]:
        plan = Slo().plan(chat, candidates, _Health(premium=premium, box=local), random.Random(0))
        assert all("misses ttft<=800ms" in r.reason for r in plan)
        return [r.target.provider_name for r in plan]

    assert order(box) == ["premium", "box"]
    assert order(msgspec.structs.replace(box, ttft_load_seen=12)) == ["box", "premium"]
    flat = msgspec.structs.replace(box, ttft_s=0.27 * 1.76, ttft_load_factor=1.0)
    assert order(flat) == ["box", "premium"]
