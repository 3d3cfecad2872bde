"""Cut attempts as censored TTFT samples (``policies.ttft_fit.censored`` through
``LatencyStats``): the expected moments, and the bias they remove from a target often cut
at a tight deadline."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from core.routing import ttft_exceeds_p, ttft_quantile_s
from policies.latency import CUT_ERROR, LatencyStats
from policies.ttft_fit import censored


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
