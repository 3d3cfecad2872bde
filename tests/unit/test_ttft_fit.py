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
from policies.latency import CUT_ERROR, LatencyStats
from policies.ttft_fit import censored


def test_the_moments_of_a_ttft_known_to_exceed_its_median():
    """z = 0: the inverse Mills ratio is pdf(0) / 0.5 = sqrt(2 / pi); E[Z^2 | Z > 0] = 1."""
    expected, err2 = censored(1.0, 1.0, 0.5)
    assert expected == pytest.approx(math.exp(0.5 * math.sqrt(2 / math.pi)))
    assert err2 == pytest.approx(0.25)


def test_the_moments_agree_with_a_monte_carlo_draw():
    rng = random.Random(7)
    predicted, waited, spread = 1.8, 2.0, 0.5
    logs = [math.log(predicted) + spread * rng.gauss(0, 1) for _ in range(200_000)]
    above = [x for x in logs if x > math.log(waited)]
    mean_log = sum(above) / len(above)
    mean_err2 = sum((x - math.log(predicted)) ** 2 for x in above) / len(above)
    expected, err2 = censored(predicted, waited, spread)
    assert math.log(expected) == pytest.approx(mean_log, abs=0.01)
    assert err2 == pytest.approx(mean_err2, rel=0.02)


def test_an_early_cut_says_almost_nothing_and_a_late_one_at_least_the_wait():
    expected, err2 = censored(1.0, 0.01, 0.4)  # cut long before the median
    assert expected == pytest.approx(1.0, abs=1e-6) and err2 == pytest.approx(0.16, abs=1e-6)
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


def budget(stats: LatencyStats | None, clock: FakeClock, censor: bool) -> LatencyStats:
    """600 attempts at a target whose TTFT is log-normal (median 1.8 s, spread 0.5), each
    cut at 2.0 s (the deadline a 3 s objective leaves it). ``censor``: cuts are reported
    as the gateway reports them; else only the answers are (the old behaviour)."""
    stats = stats or LatencyStats(clock)
    rng = random.Random(3)
    for _ in range(600):
        ttft = 1.8 * math.exp(0.5 * rng.gauss(0, 1))
        clock.advance(0.5)
        if ttft <= 2.0:
            stats.observe_ttft("budget", ttft, 100, 0)
        elif censor:
            stats.attempt_finished(
                "budget", error=CUT_ERROR, ttft_s=2.0, retryable=False, prompt_tokens=100
            )
    return stats


def test_cuts_at_a_tight_deadline_no_longer_bias_the_fit_low():
    """The fit predicts the mean TTFT, here 1.8 x e^(0.5^2 / 2) = 2.04 s. Fitted on its
    answers alone, a target cut 4 times in 10 reads a quarter quicker and half as
    spread (its answers are its quick ones: 1.51 s, 0.26); with its cuts as censored
    samples the fit finds its mean and nearly its spread (2.01 s, 0.43)."""
    mean = 1.8 * math.exp(0.5**2 / 2)
    answers_only = budget(None, FakeClock(), censor=False).ttft_model("budget")
    assert answers_only is not None and answers_only.spread is not None
    assert answers_only.predict(100) < 0.8 * mean and answers_only.spread < 0.3
    model = budget(None, FakeClock(), censor=True).ttft_model("budget")
    assert model is not None and model.spread is not None
    assert model.predict(100) == pytest.approx(mean, rel=0.1)
    assert model.spread == pytest.approx(0.5, rel=0.2)


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
