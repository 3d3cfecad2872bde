"""The TTFT fit's arithmetic (``policies.ttft_fit``) through ``LatencyStats``: cut attempts
as censored samples (the expected moments, and the bias they remove from a target often
cut at a tight deadline) and the spread per band of prompt lengths."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from core.routing import SPREAD_BAND_EDGES, spread_band, ttft_exceeds_p, ttft_quantile_s
from policies.latency import CUT_ERROR, LatencyStats
from policies.ttft_fit import (
    BAND_HALF_LIFE_S,
    PRIOR_SAMPLES,
    Fit,
    band_spreads,
    censored,
    learn,
    line,
    model_of,
)


def test_the_moments_of_a_ttft_known_to_exceed_its_median():
    """Mean 1, spread 0.5: the median is e^(-1/8); a TTFT above it (z = 0) has the
    conditional mean P(Z > -0.5) / 0.5 and, with the inverse Mills ratio sqrt(2 / pi),
    the squared log error 0.25 x (1 + 0) - 0.125 x sqrt(2 / pi) + 0.0625 / 4."""
    median = math.exp(-(0.5**2) / 2)
    expected, err2 = censored(1.0, median, 0.5)
    assert expected == pytest.approx(0.5 * math.erfc(-0.5 / math.sqrt(2)) / 0.5)
    mills = math.sqrt(2 / math.pi)
    assert err2 == pytest.approx(0.25 - 0.125 * mills + 0.0625 / 4)


def test_the_moments_agree_with_a_monte_carlo_draw():
    rng = random.Random(7)
    predicted, waited, spread = 1.8, 2.0, 0.5
    median = predicted * math.exp(-(spread**2) / 2)
    draws = [median * math.exp(spread * rng.gauss(0, 1)) for _ in range(200_000)]
    assert sum(draws) / len(draws) == pytest.approx(predicted, rel=0.01)  # the mean
    above = [x for x in draws if x > waited]
    mean_above = sum(above) / len(above)
    mean_err2 = sum(math.log(x / predicted) ** 2 for x in above) / len(above)
    expected, err2 = censored(predicted, waited, spread)
    assert expected == pytest.approx(mean_above, rel=0.01)
    assert err2 == pytest.approx(mean_err2, rel=0.02)


def test_an_early_cut_says_almost_nothing_and_a_late_one_at_least_the_wait():
    expected, err2 = censored(1.0, 0.01, 0.4)  # cut long before the median
    # The prediction itself, at its squared log error against the mean: s^2 + s^4 / 4.
    assert expected == pytest.approx(1.0, abs=1e-6)
    assert err2 == pytest.approx(0.16 + 0.0064, abs=1e-6)
    expected, _ = censored(1.0, 1e6, 0.4)  # far in the tail: the asymptote, finite
    assert 1e6 <= expected < math.inf
    assert censored(0.0, 1.0, 0.4) is None and censored(1.0, 1.0, 0.0) is None


@given(st.floats(0.01, 100), st.floats(0.001, 1000), st.floats(0.05, 2.0))
def test_the_expected_ttft_exceeds_both_the_wait_and_the_prediction(predicted, waited, spread):
    moments = censored(predicted, waited, spread)
    assert moments is not None
    expected, err2 = moments
    assert expected >= predicted * (1 - 1e-9) and expected >= waited * (1 - 1e-9)
    assert err2 >= 0


def budget(censor: bool, attempts: int = 1200) -> tuple[float, float]:
    """Attempts at a target whose TTFT is log-normal (median 1.8 s, spread 0.5), each cut
    at 2.0 s (the deadline a 3 s objective leaves it); the fit's prediction and spread,
    each averaged over the second half (one fit's last value is a noisy draw: its
    errors are an exponential average over ~20 samples). ``censor``: cuts are reported
    as the gateway reports them; else only the answers are (the old behaviour)."""
    clock = FakeClock()
    stats = LatencyStats(clock)
    rng = random.Random(3)
    predictions: list[float] = []
    spreads: list[float] = []
    for attempt in range(attempts):
        ttft = 1.8 * math.exp(0.5 * rng.gauss(0, 1))
        clock.advance(0.5)
        if ttft <= 2.0:
            stats.observe_ttft("budget", ttft, 100, 0)
        elif censor:
            stats.attempt_finished(
                "budget", error=CUT_ERROR, ttft_s=2.0, retryable=False, prompt_tokens=100
            )
        model = stats.ttft_model("budget")
        if attempt >= attempts // 2 and model is not None and model.spread is not None:
            predictions.append(model.predict(100))
            spreads.append(model.spread)
    return sum(predictions) / len(predictions), sum(spreads) / len(spreads)


def test_cuts_at_a_tight_deadline_no_longer_bias_the_fit_low():
    """The fit predicts the mean TTFT, here 1.8 x e^(0.5^2 / 2) = 2.04 s, and its spread
    is the RMS log error against that mean, sqrt(0.5^2 + 0.5^4 / 4) = 0.52. Fitted on its
    answers alone, a target cut 4 times in 10 reads a quarter quicker and half as spread
    (its answers are its quick ones: 1.38 s, 0.33); with its cuts as censored samples the
    fit finds both (2.10 s, 0.53)."""
    mean, rms = 1.8 * math.exp(0.5**2 / 2), math.sqrt(0.5**2 + 0.5**4 / 4)
    predicted, spread = budget(censor=False)
    assert predicted < 0.8 * mean and spread < 0.7 * rms
    predicted, spread = budget(censor=True)
    assert predicted == pytest.approx(mean, rel=0.05)
    assert spread == pytest.approx(rms, rel=0.1)


def test_a_cut_past_the_p90_is_a_penalty_not_a_sample_and_unmeasured_targets_learn_nothing():
    clock = FakeClock()
    stats = LatencyStats(clock)
    for _ in range(20):
        stats.observe_ttft("mid", 1.0, 100, 0)
    before = stats.ttft_model("mid")
    stats.attempt_finished("mid", error=CUT_ERROR, ttft_s=20.0, retryable=False, prompt_tokens=100)
    assert stats.ttft_model("mid") == before  # a hang says nothing of its ordinary spread
    assert stats.health("mid").ttft_penalty > 1.0
    stats.attempt_finished("new", error=CUT_ERROR, ttft_s=1.0, retryable=False, prompt_tokens=100)
    assert stats.ttft_model("new") is None


@given(st.floats(0.01, 100), st.floats(0.0, 3.0), st.floats(0.0, 4.0), st.floats(0.0, 3.0))
def test_the_tail_is_the_exceedance_inverted_and_never_falls_with_the_spread(
    mean, spread, z, wider
):
    """Below the peak (spread <= z) the z-quantile is exceeded 1 - Phi(z) of the time;
    a wider spread never gives a shorter tail; at z = 0 or no spread, the mean."""
    tail = ttft_quantile_s(mean, spread, z)
    if 0.01 <= spread <= z:  # (a subnormal spread rounds the tail to the mean)
        assert ttft_exceeds_p(mean, spread, tail) == pytest.approx(
            0.5 * math.erfc(z / math.sqrt(2)), rel=1e-6, abs=1e-12
        )
    assert ttft_quantile_s(mean, spread + wider, z) >= tail * (1 - 1e-12)
    assert ttft_quantile_s(mean, spread, 0.0) == pytest.approx(mean)
    assert ttft_quantile_s(mean, 0.0, z) == pytest.approx(mean)


def test_errors_are_kept_per_band_of_prompt_lengths():
    """Each checked error goes to the overall mean square and to its prompt's band."""
    assert [spread_band(n) for n in (0, 255, 256, 1023, 1024, 4096, 16384, 10**6)] == [
        0,
        0,
        1,
        1,
        2,
        3,
        4,
        4,
    ]
    fit = Fit(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    learn(fit, 100, 1.0, 0.5, prior_tokens=0)  # the first sample: nothing to check
    learn(fit, 100, 2.0, 0.5, prior_tokens=0)  # predicted 1.0: error ln 2, band 0
    base, slope = line(fit)
    assert (base, slope) == (pytest.approx(1 + 2 / 3), 0.0)  # flat: one prompt length yet
    learn(fit, 5000, 1.2, 0.5, prior_tokens=0)  # band 3, against that line
    assert fit.band_weight[1] == fit.band_weight[2] == fit.band_weight[4] == 0.0
    assert fit.band_err2[0] == pytest.approx(math.log(2) ** 2)
    assert fit.band_err2[3] == pytest.approx(math.log(1.2 / base) ** 2)
    assert fit.err2 == pytest.approx(
        (math.log(2) ** 2 + 2 * math.log(1.2 / base) ** 2)
        / 3  # weighted 1/3 and 2/3 (a decayed sum warming up)
    )
    model = model_of(fit, 0.5)
    assert [checked for checked, _ in model.bands] == [
        pytest.approx(1.0),
        0.0,
        0.0,
        pytest.approx(1.0),
        0.0,
    ]


@given(
    st.floats(0.05, 2.0),
    st.floats(0.01, 2.0),
    st.floats(0.0, 50.0),
    st.floats(1e-4, 4.0),
    st.floats(0.0, 50.0),
)
def test_a_band_spread_is_between_the_overall_and_its_own_and_seldom_seen_reads_overall(
    overall, measured, checked, err2, more
):
    """A band with no samples, or whose errors match the whole, reads the overall
    spread; otherwise it moves towards its own ratio as its samples grow, never past it."""
    bands = ((0.0, err2), (checked, measured**2), (checked, err2), (checked + more, err2))
    empty, same, band, later = band_spreads(overall, measured, bands)
    assert empty == overall and same == pytest.approx(overall)
    full = overall * math.sqrt(err2) / measured  # the band's ratio, unshrunk
    assert min(overall, full) * (1 - 1e-9) <= band <= max(overall, full) * (1 + 1e-9)
    assert abs(math.log(later / band)) <= abs(math.log(full / band)) + 1e-9  # towards full
    assert band_spreads(overall, None, bands) == (overall,) * 4  # nothing measured
    one_band = band_spreads(overall, measured, ((PRIOR_SAMPLES, 4 * measured**2),))[0]
    assert one_band == pytest.approx(overall * 2**0.5)  # half-way: sqrt(4)^(1/2)


def _premium_like(rng: random.Random, tokens: int) -> float:
    """The end-to-end menu's premium: a log-normal start (median 0.35 s, log spread 0.35)
    plus 0.05 ms per prompt token."""
    return 0.35 * math.exp(0.35 * rng.gauss(0.0, 1.0)) + 0.05e-3 * tokens


def test_long_prompts_get_their_own_narrower_tail_which_holds_its_p99():
    """A target whose prefill is steadier than its start: the spread measured on long
    prompts is narrower than on short ones, and the p99 drawn with it is exceeded about
    1% of the time by long prompts (the overall spread's p99 far less: a tail too long,
    which sent them to dearer targets). 4 seeds x 4,000 requests, 30% of them RAG-long."""
    late_band = late_overall = long_requests = 0
    for seed in range(4):
        rng, clock = random.Random(seed), FakeClock()
        stats = LatencyStats(clock)
        for index in range(4000):
            tokens = rng.randint(2000, 6000) if rng.random() < 0.3 else rng.randint(50, 400)
            seconds = _premium_like(rng, tokens)
            if index >= 1000 and tokens >= 4096:
                health = stats.health("premium")
                assert health.ttft_base_s is not None and health.ttft_per_token_s is not None
                assert health.ttft_spread is not None
                mean = health.ttft_base_s + health.ttft_per_token_s * tokens
                band = health.spread_for(tokens) or 0.0
                long_requests += 1
                late_band += seconds > ttft_quantile_s(mean, band, 2.3263)
                late_overall += seconds > ttft_quantile_s(mean, health.ttft_spread, 2.3263)
            stats.observe_ttft("premium", seconds, prompt_tokens=tokens)
            clock.advance(0.2)
        spreads = stats.health("premium").ttft_band_spreads
        assert len(spreads) == len(SPREAD_BAND_EDGES)
        assert spreads[3] < 0.8 * spreads[0]  # 4,096+ tokens against under 256
    assert 0.004 < late_band / long_requests < 0.025
    assert late_overall / long_requests < 0.5 * late_band / long_requests


def test_a_band_without_samples_fades_to_the_overall_spread():
    """A band's count halves every ``BAND_HALF_LIFE_S`` since its last error, so a band a
    target no longer gets samples in (it looked erratic there, so it is not sent those
    prompts) drifts back to the overall spread instead of keeping its worst errors."""
    fit = Fit(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    for second, (tokens, seconds) in enumerate([(100, 1.0), (100, 1.1), (5000, 3.0)]):
        learn(fit, tokens, seconds, 0.5, prior_tokens=0, at=float(second))
    fresh = model_of(fit, 0.5, now=2.0)
    later = model_of(fit, 0.5, now=2.0 + BAND_HALF_LIFE_S)
    assert later.bands[3][0] == pytest.approx(fresh.bands[3][0] / 2)
    assert later.bands[0][0] == pytest.approx(fresh.bands[0][0] / 2)  # each band alike
    overall = 0.4
    wide_then, wide_later = (band_spreads(overall, m.spread, m.bands)[3] for m in (fresh, later))
    assert overall < wide_later < wide_then  # long prompts erred most: nearer overall later
