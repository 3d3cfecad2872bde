"""Latency EWMAs and the TTFT model: the arithmetic, freshness on the injected clock, the
observer hook."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from core.routing import SPREAD_BAND_EDGES, TargetHealth
from policies.latency import DEFAULT_MAX_AGE_S, LatencyStats
from policies.ttft_fit import PRIOR_SPREAD, TtftModel, routing_spread


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


# ---------------------------------------------------------------- TTFT model
def _line(model: TtftModel | None) -> tuple[float, float, float | None] | None:
    """A model's line and overall spread (its per-band errors left out)."""
    return None if model is None else (model.base_s, model.per_token_s, model.spread)


def test_ttft_model_fits_prompt_length_and_measures_its_error_out_of_sample():
    stats = LatencyStats(FakeClock(), alpha=0.5, prior_tokens=0)
    stats.observe_ttft("a", 1.0, prompt_tokens=0)
    assert _line(stats.ttft_model("a")) == (1.0, 0.0, None)  # one sample: flat, unchecked
    stats.observe_ttft("a", 2.0, prompt_tokens=1000)  # predicted 1.0: log error ln 2
    model = stats.ttft_model("a")
    assert model.base_s == pytest.approx(1.0)
    assert model.per_token_s == pytest.approx(0.001)  # two points: the line through both
    assert model.spread == pytest.approx(math.log(2))
    assert model.predict(3000) == pytest.approx(4.0)
    stats.observe_ttft("a", 4.0, prompt_tokens=3000)  # on the line: error 0
    model = stats.ttft_model("a")
    assert (model.base_s, model.per_token_s) == (pytest.approx(1.0), pytest.approx(0.001))
    # Errors ln 2 then 0, weighted 1/3 and 2/3 (the warm-up of a decayed sum from 0).
    assert model.spread == pytest.approx(math.log(2) / math.sqrt(3))
    assert stats.estimate("a")[0] == pytest.approx(0.25 * 1.0 + 0.25 * 2.0 + 0.5 * 4.0)


def test_ttft_model_slope_is_shrunk_by_the_prior():
    # The slow fit at the same speed: the fast one predicts with its slope (checked below).
    stats = LatencyStats(FakeClock(), alpha=0.5, slow_alpha=0.5, prior_tokens=1000)
    stats.observe_ttft("a", 1.0, prompt_tokens=0)
    stats.observe_ttft("a", 2.0, prompt_tokens=1000)
    # var(x) = 2e6/9 and cov = 2000/9: slope 2000 / (2e6 + 9e6); the line keeps the mean.
    model = stats.ttft_model("a")
    assert model.per_token_s == pytest.approx(1 / 5500)
    assert model.base_s == pytest.approx(5 / 3 - (2000 / 3) / 5500)


def test_the_fast_fit_predicts_with_the_slow_slope_and_its_own_level():
    """A premium-like target (median 0.35 s, spread 0.35, 0.05 ms per prompt token), a
    quarter of its prompts ~4,000 tokens: the long-prompt prediction varies far less with
    the slow fit's slope than with the fast fit's own (a slow fit as fast as the fast
    one), and neither is biased."""
    rng = random.Random(1)
    slow_slope, own_slope = LatencyStats(FakeClock()), LatencyStats(FakeClock(), slow_alpha=0.1)
    assert own_slope.alpha == 0.1
    with_slow: list[float] = []
    with_own: list[float] = []
    for i in range(3000):
        tokens = rng.randint(3000, 5000) if rng.random() < 0.25 else rng.randint(50, 500)
        ttft = 0.35 * math.exp(0.35 * rng.gauss(0, 1)) + tokens * 5e-5
        for stats, seen in ((slow_slope, with_slow), (own_slope, with_own)):
            stats.observe_ttft("p", ttft, tokens)
            if i >= 300:
                seen.append(stats.ttft_model("p").predict(4000))
    true = 0.35 * math.exp(0.35**2 / 2) + 0.2
    assert statistics.mean(with_slow) == pytest.approx(true, rel=0.03)
    assert statistics.mean(with_own) == pytest.approx(true, rel=0.03)
    assert statistics.pstdev(with_slow) < 0.75 * statistics.pstdev(with_own)


def test_a_slope_learnt_on_long_prompts_survives_a_run_of_short_ones():
    """Once long prompts are routed elsewhere a target sees only short ones; exponential
    forgetting then shrinks var(x) far below the prior, and the slope must not decay with
    it (a ridge towards 0 would leave ~0.6% of it here and call a 40k prompt fast)."""
    stats = LatencyStats(FakeClock(), alpha=0.2, prior_tokens=1000)
    for i in range(30):
        x = 40_000 * (i % 2)
        stats.observe_ttft("a", 0.5 + 1e-4 * x, prompt_tokens=x)
    assert stats.ttft_model("a").per_token_s == pytest.approx(1e-4, rel=1e-3)
    for _ in range(50):
        stats.observe_ttft("a", 0.5 + 1e-4 * 500, prompt_tokens=500)
    model = stats.ttft_model("a")
    assert model.per_token_s == pytest.approx(1e-4, rel=1e-3)
    assert model.predict(40_000) == pytest.approx(4.5, rel=1e-3)


def test_ttft_model_stays_physical():
    falling = LatencyStats(FakeClock(), alpha=0.5, slow_alpha=0.5, prior_tokens=0)
    falling.observe_ttft("a", 2.0, prompt_tokens=0)
    falling.observe_ttft("a", 1.0, prompt_tokens=1000)
    flat = falling.ttft_model("a")
    assert (flat.base_s, flat.per_token_s) == (pytest.approx(4 / 3), 0.0)  # flat at the mean
    steep = LatencyStats(FakeClock(), alpha=0.5, slow_alpha=0.5, prior_tokens=0)
    steep.observe_ttft("a", 0.5, prompt_tokens=1000)
    steep.observe_ttft("a", 2.5, prompt_tokens=2000)  # base would be -1.5
    model = steep.ttft_model("a")
    assert model.base_s == 0.0  # through the origin and the mean point (5000/3, 11/6)
    assert model.per_token_s == pytest.approx((11 / 6) / (5000 / 3))


def test_samples_without_prompt_tokens_update_only_the_mean():
    stats = LatencyStats(FakeClock(), alpha=1.0)
    stats.observe_ttft("a", 0.7)
    stats.attempt_finished("a", error=None, ttft_s=0.9, retryable=False)
    assert stats.ttft_model("a") is None
    assert stats.health("a") == TargetHealth(ttft_s=0.9)
    stats.attempt_finished("a", error=None, ttft_s=0.4, retryable=False, prompt_tokens=300)
    stats.attempt_finished(
        "a", error="UpstreamServerError", ttft_s=9.0, retryable=True, prompt_tokens=300
    )
    stats.observe_tokens("a", 10, 0.2)
    assert stats.health("a") == TargetHealth(
        ttft_s=0.4,
        tpot_s=0.02,
        ttft_base_s=0.4,
        ttft_per_token_s=0.0,
        ttft_spread=PRIOR_SPREAD,  # no error checked yet: the prior alone
        ttft_band_spreads=(PRIOR_SPREAD,) * len(SPREAD_BAND_EDGES),  # each band the same
        ttft_age_s=0.0,
        ttft_band_ages_s=(None, 0.0, None, None, None),  # 300 tokens: the second band
        ttft_steady_base_s=0.4,  # the slow fit has learnt the same sample
        ttft_steady_per_token_s=0.0,
        ttft_steady_band_spreads=(PRIOR_SPREAD,) * len(SPREAD_BAND_EDGES),
        ttft_steady_reach_tokens=1300.0,  # one 300-token prompt + the 1,000 margin
    )


@pytest.mark.parametrize(
    ("spread", "checked", "expected"),
    [
        (None, 0.0, PRIOR_SPREAD),  # nothing checked: the prior
        (0.0, 3.0, PRIOR_SPREAD / math.sqrt(2)),  # three perfect samples halve its weight
        (0.4, 1e9, 0.4),  # many samples: the measured spread
    ],
)
def test_routing_spread_pools_the_measured_spread_with_the_prior(spread, checked, expected):
    assert routing_spread(spread, checked) == pytest.approx(expected, rel=1e-6)


def test_a_target_measured_twice_alike_is_not_taken_for_certain():
    """Two equal samples measure no spread; routing still sees most of the prior's."""
    stats = LatencyStats(FakeClock(), alpha=0.1, prior_tokens=0)
    for _ in range(2):
        stats.observe_ttft("a", 1.0, prompt_tokens=100)
    assert stats.ttft_model("a").spread == 0.0
    assert stats.health("a").ttft_spread == pytest.approx(
        routing_spread(0.0, 1.0)  # one checked error (the first sample had none)
    )
    assert stats.health("a").ttft_spread > 0.4


def test_ttft_model_is_forgotten_after_the_default_max_ages():
    """The fast fit after 300 s; the slow one (what the prediction relaxed to) after 12x
    that; then the target reads as unmeasured."""
    clock = FakeClock()
    stats = LatencyStats(clock)
    assert stats.max_age_s == DEFAULT_MAX_AGE_S == 300
    stats.observe_ttft("a", 9.0, prompt_tokens=100)
    clock.advance(300.1)
    assert _line(stats.ttft_model("a")) == (9.0, 0.0, None)  # the slow fit
    stats.observe_ttft("a", 0.3, prompt_tokens=5000)  # a fresh fast fit, not mixed with 9 s
    assert _line(stats.ttft_model("a")) == (0.3, 0.0, None)
    clock.advance(3600.1)
    assert stats.ttft_model("a") is None and stats.health("a") == TargetHealth()


lines = st.tuples(st.floats(0.01, 5), st.floats(0, 1e-3))
prompts = st.lists(st.integers(0, 50_000), min_size=2, max_size=40)


@given(lines, prompts)
def test_samples_on_a_line_are_fitted_to_that_line(line, xs):
    base, slope = line
    stats = LatencyStats(FakeClock(), alpha=0.3, prior_tokens=0)
    for x in xs:
        stats.observe_ttft("a", base + slope * x, prompt_tokens=x)
    model = stats.ttft_model("a")
    if len(set(xs)) > 1:
        assert model.base_s == pytest.approx(base, rel=1e-6, abs=1e-9)
        assert model.per_token_s == pytest.approx(slope, rel=1e-6, abs=1e-12)
    for x in xs:
        assert model.predict(x) == pytest.approx(base + slope * x, rel=1e-6)


@given(
    st.lists(st.tuples(st.integers(0, 100_000), st.floats(0, 60)), min_size=1, max_size=40),
    st.floats(0.01, 1),
    st.floats(0, 5000),
)
def test_ttft_model_is_never_negative(samples, alpha, prior):
    stats = LatencyStats(FakeClock(), alpha=alpha, prior_tokens=prior)
    for tokens, seconds in samples:
        stats.observe_ttft("a", seconds, prompt_tokens=tokens)
    model = stats.ttft_model("a")
    assert model.base_s >= 0 and model.per_token_s >= 0
    assert model.spread is None or model.spread >= 0
    # The base is the fitted TTFT of an empty prompt: never above the slowest sample.
    assert model.base_s <= max(s for _, s in samples) * (1 + 1e-9) + 1e-12
