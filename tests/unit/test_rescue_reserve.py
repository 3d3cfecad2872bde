"""What a rescue is reserved (``routers.strategies.predict.as_rescue``): the longer of its
prediction's p99 and its slow fit's, so a rescue whose fast fit reads lucky after a few
quick answers is not left less than its real p99 by the cut before it."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from core.routing import RouteRequest, TargetHealth, ttft_quantile_s
from policies.latency import LatencyStats
from routers.strategies.deadlines import SWITCH_S, first_token_deadlines
from routers.strategies.predict import (
    RESERVE_Z,
    UNSEEN_PREFILL_S_PER_TOKEN,
    as_rescue,
    ttft_s,
    ttft_tail_s,
)
from tests.unit.test_routing_promise import Health, tgt

CHAT = RouteRequest(model="alias", prompt_tokens=200, max_tokens=100, slo_ttft_ms=3000)
# premium after a run of quick answers: its fit reads 0.28 s at a 0.3 spread, its slow
# fit what it has been over the last hundred samples, 0.38 s at 0.35
LUCKY = TargetHealth(
    ttft_s=0.28,
    ttft_base_s=0.28,
    ttft_per_token_s=0.0,
    ttft_spread=0.3,
    ttft_steady_base_s=0.38,
    ttft_steady_per_token_s=0.0,
    ttft_steady_band_spreads=(0.35,) * 5,
)


def test_a_rescue_is_judged_by_the_longer_of_its_two_fits():
    steady = as_rescue(CHAT, LUCKY)
    assert ttft_s(CHAT, steady) == pytest.approx(0.38)
    assert ttft_tail_s(CHAT, steady, RESERVE_Z) == pytest.approx(
        ttft_quantile_s(0.38, 0.35, RESERVE_Z)
    )
    slowing = msgspec.structs.replace(LUCKY, ttft_base_s=0.9)  # the fast fit sees a slow-down
    assert as_rescue(CHAT, slowing) == slowing
    unfitted = TargetHealth(ttft_s=0.3)
    assert as_rescue(CHAT, unfitted) == unfitted


def test_load_and_penalty_apply_to_the_steady_model_too():
    loaded = msgspec.structs.replace(LUCKY, ttft_load_factor=2.0, ttft_penalty=1.5)
    assert ttft_s(CHAT, as_rescue(CHAT, loaded)) == pytest.approx(0.38 * 2.0 * 1.5)


def test_the_cut_before_a_rescue_leaves_it_its_steady_p99():
    plan = [tgt("box"), tgt("premium")]
    box = TargetHealth(ttft_s=0.25, ttft_spread=0.3)
    got = first_token_deadlines(CHAT, plan, Health(box=box, premium=LUCKY))["box/m"]
    assert got.by_s == pytest.approx(3.0 - ttft_quantile_s(0.38, 0.35, RESERVE_Z) - SWITCH_S)
    fast_only = msgspec.structs.replace(LUCKY, ttft_steady_base_s=None)
    later = first_token_deadlines(CHAT, plan, Health(box=box, premium=fast_only))["box/m"]
    assert later.by_s == pytest.approx(3.0 - ttft_quantile_s(0.28, 0.3, RESERVE_Z) - SWITCH_S)


def test_a_prompt_longer_than_the_slope_is_known_for_is_reserved_the_unseen_prefill():
    """premium has seen chat prompts only (its slope reads 0 up to 1,700 tokens): a
    4,000-token RAG prompt is reserved 0.1 ms for each of its 2,300 tokens past that; a
    chat prompt, or a target whose learnt slope is steeper, keeps its own."""
    seen_chat = msgspec.structs.replace(LUCKY, ttft_steady_reach_tokens=1700.0)
    rag = RouteRequest(model="alias", prompt_tokens=4000, slo_ttft_ms=3000)
    assert ttft_s(rag, as_rescue(rag, seen_chat)) == pytest.approx(
        0.38 + 2300 * UNSEEN_PREFILL_S_PER_TOKEN
    )
    assert ttft_s(CHAT, as_rescue(CHAT, seen_chat)) == pytest.approx(0.38)
    steep = msgspec.structs.replace(seen_chat, ttft_steady_per_token_s=5e-4)
    assert ttft_s(rag, as_rescue(rag, steep)) == pytest.approx(0.38 + 4000 * 5e-4)


def test_the_reach_grows_with_the_prompts_the_slow_fit_sees():
    clock = FakeClock()
    stats = LatencyStats(clock)
    rng = random.Random(5)
    for _ in range(200):
        clock.advance(0.2)
        stats.observe_ttft("p", 0.35 * rng.lognormvariate(0.0, 0.35), prompt_tokens=200)
    chat_reach = stats.health("p").ttft_steady_reach_tokens
    assert chat_reach is not None and 1200 <= chat_reach < 1300  # 200 + 2 x 0 + 1000
    rag = RouteRequest(model="alias", prompt_tokens=4000, slo_ttft_ms=3000)
    chat_only = stats.health("p")
    assert ttft_s(rag, as_rescue(rag, chat_only)) == pytest.approx(
        (ttft_s(rag, chat_only) or 0.0) + (4000 - chat_reach) * UNSEEN_PREFILL_S_PER_TOKEN,
        rel=0.05,  # the slope read ~0 on equal prompts: the steady fit may be the longer
    )
    for i in range(200):
        clock.advance(0.2)
        tokens = 200 if i % 2 else 4000
        ttft = 0.35 * rng.lognormvariate(0.0, 0.35) + 5e-5 * tokens
        stats.observe_ttft("p", ttft, prompt_tokens=tokens)
    health = stats.health("p")
    assert health.ttft_steady_reach_tokens is not None
    assert health.ttft_steady_reach_tokens > 4000
    assert as_rescue(rag, health).ttft_per_token_s < UNSEEN_PREFILL_S_PER_TOKEN
    for _ in range(300):  # chat only again: the usual prompts' reach falls, not this one
        clock.advance(0.2)
        stats.observe_ttft("p", 0.35 * rng.lognormvariate(0.0, 0.35), prompt_tokens=200)
    assert stats.fits.extrapolated("p", 4000)  # no longer usual: not watched as overdue
    assert stats.health("p").ttft_steady_reach_tokens == pytest.approx(5000)
    assert as_rescue(rag, stats.health("p")).ttft_per_token_s < UNSEEN_PREFILL_S_PER_TOKEN


@given(
    fast=st.floats(0.05, 5.0),
    steady=st.floats(0.05, 5.0),
    spreads=st.tuples(st.floats(0.0, 1.5), st.floats(0.0, 1.5)),
    tokens=st.integers(0, 20_000),
)
def test_the_reserve_is_never_shorter_than_either_fit(fast, steady, spreads, tokens):
    health = TargetHealth(
        ttft_base_s=fast,
        ttft_per_token_s=1e-5,
        ttft_spread=spreads[0],
        ttft_steady_base_s=steady,
        ttft_steady_per_token_s=2e-5,
        ttft_steady_band_spreads=(spreads[1],) * 5,
    )
    req = RouteRequest(model="alias", prompt_tokens=tokens, slo_ttft_ms=3000)
    reserve = ttft_tail_s(req, as_rescue(req, health), RESERVE_Z)
    own = ttft_tail_s(req, health, RESERVE_Z)
    steady_only = ttft_quantile_s(steady + 2e-5 * tokens, spreads[1], RESERVE_Z)
    assert reserve == pytest.approx(max(own, steady_only))


def test_the_slow_fit_holds_what_the_target_has_been_while_the_fast_fit_swings():
    """Offline, a premium-like target (log-normal, median 0.35 s, spread 0.35): the fast
    fit's base swings with its last samples, the slow fit's much less."""
    clock = FakeClock()
    stats = LatencyStats(clock)
    rng = random.Random(3)
    fast_bases, steady_bases = [], []
    for i in range(3000):
        clock.advance(0.2)
        stats.observe_ttft("p", 0.35 * rng.lognormvariate(0.0, 0.35), prompt_tokens=200)
        if i >= 500:
            health = stats.health("p")
            fast_bases.append(health.ttft_base_s + 200 * health.ttft_per_token_s)
            steady_bases.append(health.ttft_steady_base_s + 200 * health.ttft_steady_per_token_s)

    def swing(xs: list[float]) -> float:
        xs = sorted(xs)
        return xs[int(0.95 * len(xs))] - xs[int(0.05 * len(xs))]

    assert swing(steady_bases) < 0.5 * swing(fast_bases)
    true_mean = 0.35 * 1.0632  # exp(0.35^2 / 2)
    assert sum(steady_bases) / len(steady_bases) == pytest.approx(true_mean, rel=0.05)
