"""Evidence age per band of prompt lengths (``TargetHealth.ttft_band_ages_s``) and the
exploration it drives (``routers.strategies.explore.evidence_age_s``).

The end-to-end run showed the failure these guard against: `mid`'s slope was fitted at
0.4 ms per prompt token from its first few samples (the menu's is 0.05), so 4,000-token
RAG was predicted at 2.6 s there and went to premium; chat kept `mid`'s estimate fresh,
so exploration never re-tried it with a long prompt and the slope was never corrected."""

from __future__ import annotations

import math
import random

import pytest

from core.clock import FakeClock
from core.config_routing import SloStrategy
from core.routing import SPREAD_BAND_EDGES, RouteRequest, TargetHealth, spread_band
from policies.latency import LatencyStats
from routers.strategies import explore
from routers.strategies.slo import Slo
from tests.unit.test_routing_promise import FAST, FixedRandom, Health, tgt

RAG = RouteRequest(model="alias", prompt_tokens=4000, max_tokens=100, slo_ttft_ms=3000)
CHAT = RouteRequest(model="alias", prompt_tokens=200, max_tokens=100, slo_ttft_ms=3000)


def test_each_band_ages_from_its_own_last_sample():
    clock = FakeClock()
    stats = LatencyStats(clock)
    assert stats.health("a").ttft_band_ages_s == ()  # unmeasured
    stats.observe_ttft("a", 2.0, prompt_tokens=4000)
    for _ in range(30):
        clock.advance(1.0)
        stats.observe_ttft("a", 1.0, prompt_tokens=200)
    health = stats.health("a")
    ages = dict(zip(SPREAD_BAND_EDGES, health.ttft_band_ages_s, strict=True))
    assert ages == {0: 0.0, 256: None, 1024: 30.0, 4096: None, 16384: None}
    assert health.age_for(4000) == 30.0 and health.age_for(100) == 0.0
    assert health.age_for(20_000) == health.ttft_age_s == 0.0  # never seen: the target's


def test_cuts_learnt_as_censored_samples_refresh_their_band():
    clock = FakeClock()
    stats = LatencyStats(clock)
    for _ in range(5):
        stats.observe_ttft("a", 1.0, prompt_tokens=4000)
    clock.advance(20.0)
    stats.attempt_finished(  # well ahead of the p99: a censored sample, no penalty
        "a", error="AttemptDeadlineError", ttft_s=0.8, retryable=False, prompt_tokens=4000
    )
    assert stats.health("a").ttft_penalty == 1.0
    assert stats.health("a").age_for(4000) == 0.0


def _mid(long_band_age_s: float) -> TargetHealth:
    """A target fresh on chat that is predicted to miss 3 s on 4,000-token prompts."""
    ages = [0.0] * len(SPREAD_BAND_EDGES)
    ages[spread_band(4000)] = long_band_age_s
    return TargetHealth(
        ttft_s=1.2,
        ttft_base_s=1.0,
        ttft_per_token_s=0.0005,  # 3.0 s at 4,000 tokens
        ttft_spread=0.3,
        ttft_age_s=0.0,
        ttft_band_ages_s=tuple(ages),
    )


def _first(req: RouteRequest, mid: TargetHealth, draw: float = 0.01) -> str:
    plan = Slo().plan(
        req,
        [tgt("mid", 1.0), tgt("premium", 9.0)],
        Health(mid=mid, premium=FAST),
        FixedRandom(draw),
    )
    return plan[0].target.provider_name


def test_a_long_prompt_explores_a_target_whose_long_prompt_evidence_is_stale():
    assert explore.evidence_age_s(RAG, _mid(30.0)) == 30.0
    assert _first(RAG, _mid(30.0)) == "mid"
    assert _first(RAG, _mid(5.0)) == "premium"  # under explore_after_s (10 s)
    assert _first(RAG, _mid(30.0), draw=0.06) == "premium"  # over the 5% share
    assert _first(CHAT, _mid(30.0)) == "mid"  # feasible for chat anyway: no probe needed


def test_a_penalty_covering_the_prompt_rules_its_age():
    penalized = TargetHealth(
        ttft_s=1.2,
        ttft_age_s=0.0,
        ttft_band_ages_s=(0.0, 0.0, 40.0, None, None),
        ttft_penalty=4.0,
        ttft_penalty_from_tokens=1000,
        ttft_penalty_age_s=2.0,
    )
    assert explore.evidence_age_s(RAG, penalized) == 2.0
    assert explore.evidence_age_s(CHAT, penalized) == 0.0


def test_probes_correct_a_slope_fitted_on_unlucky_first_samples():
    """Offline, the scenario of the module docstring: a few probes bring the long-prompt
    prediction from ~3 s to under 2 s; chat alone leaves it where it was."""
    clock = FakeClock()
    stats = LatencyStats(clock)
    rng = random.Random(1)

    def draw(tokens: int) -> float:  # mid's menu: a log-normal start plus 0.05 ms a token
        return 1.2 * math.exp(rng.gauss(0.0, 0.35) - 0.35**2 / 2) + 0.00005 * tokens

    def chat(seconds: float) -> None:
        for _ in range(int(seconds / 0.3)):
            clock.advance(0.3)
            stats.observe_ttft("mid", draw(200), prompt_tokens=200)

    def rag_mean() -> float:
        health = stats.health("mid")
        return health.ttft_base_s + health.ttft_per_token_s * 4000

    for tokens, seconds in [(200, 1.2), (4000, 2.9), (150, 1.1), (4000, 3.1), (300, 1.3)]:
        stats.observe_ttft("mid", seconds, prompt_tokens=tokens)
    chat(30.0)
    unlucky = rag_mean()
    assert unlucky > 2.5 and stats.health("mid").age_for(4000) == pytest.approx(30.0)
    for _ in range(4):
        stats.observe_ttft("mid", draw(4000), prompt_tokens=4000)  # the probe
        assert stats.health("mid").age_for(4000) == 0.0
        chat(10.0)
    assert rag_mean() < 2.0 < unlucky


@pytest.mark.parametrize("share", [0.0, 0.5])
def test_band_staleness_obeys_the_explore_share(share):
    plan = Slo(SloStrategy(explore_share=share)).plan(
        RAG,
        [tgt("mid", 1.0), tgt("premium", 9.0)],
        Health(mid=_mid(30.0), premium=FAST),
        FixedRandom(0.3),
    )
    assert plan[0].target.provider_name == ("mid" if share > 0.3 else "premium")
