"""The TTFT model of one target: TTFT = base + per-token slope x prompt tokens, fitted by
exponentially weighted least squares, with its out-of-sample log error (the spread). The
fitting rules (ridge towards the known slope, physical lines, warm-up) are explained in
``policies.latency``'s docstring, which owns these fits.

Censored samples (``censored``): an attempt cut at its first-token deadline after
``w`` seconds has a TTFT above ``w``, by an unknown amount. Leaving it out biases the fit
low (only the quick answers are learnt: end to end, ``budget``, median 1.8 s, was cut at
~2 s four times in ten and its fit read 1.4 s, so it kept being sent 3 s requests it then
missed). Reading the wait as a sample biases it just as wrongly the other way on a short
wait. Instead a cut contributes what the current model expects of a TTFT known to exceed
``w``, as one step of EM for a right-censored log-normal: the prediction is its mean, so
its median is ``m = predicted x exp(-spread^2 / 2)``; with ``z = ln(w / m) / spread``, the
sample is the conditional mean ``E[TTFT | TTFT > w] = predicted x P(Z > z - spread) /
P(Z > z)`` (the fit is one of means, in seconds), and its squared log error (against the
prediction, as ``learn`` counts a sample's) is the expected one, from the truncated
normal's first two moments (inverse Mills ratio ``lambda(z) = pdf(z) / (1 - cdf(z))``). A
cut long before the median says almost nothing (the prediction itself, at its own
spread); a cut far in the tail says the target is at least that slow.
"""

from __future__ import annotations

import math

from msgspec import Struct, field

from core.routing import SPREAD_BAND_EDGES, spread_band, ttft_z

# How fast a band of prompt lengths that gets no samples loses its own spread to the
# target's overall one (``model_of``), as the fast fit relaxes towards the slow one.
BAND_HALF_LIFE_S = 30.0


def _no_bands() -> list[float]:
    return [0.0] * len(SPREAD_BAND_EDGES)


def _unseen_bands() -> list[float | None]:
    return [None] * len(SPREAD_BAND_EDGES)


class Fit(Struct):
    """Exponentially weighted moments of (prompt tokens x, TTFT y) and the mean square log
    prediction error, over all samples and per band of prompt lengths
    (``core.routing.SPREAD_BAND_EDGES``); ``weight``, ``err_weight`` and ``band_weight``
    are the decayed sums of the sample weights (from 0: the warm-up)."""

    weight: float
    mean_x: float
    mean_y: float
    var_x: float
    cov_xy: float
    err_weight: float
    err2: float
    at: float  # clock.now() of the last sample
    slope: float = 0.0  # seconds per prompt token, remembered (see ``learn``)
    band_weight: list[float] = field(default_factory=_no_bands)
    band_err2: list[float] = field(default_factory=_no_bands)
    # clock.now() of the band's last sample (None: none yet): how old what the fit knows
    # of that band's prompts is (``TwoSpeedFits.band_ages_s``), and when its count of
    # checked errors started to fade (``model_of``).
    band_at: list[float | None] = field(default_factory=_unseen_bands)
    max_x: float = 0.0  # the longest prompt learnt from (``reach_tokens``)


class TtftModel(Struct, frozen=True):
    """TTFT = ``base_s`` + ``per_token_s`` x prompt tokens; ``spread`` is the RMS log
    prediction error (None until a prediction has been checked); ``bands``, per band of
    prompt lengths, (samples checked, mean square log error) there."""

    base_s: float
    per_token_s: float
    spread: float | None
    bands: tuple[tuple[float, float], ...] = ()

    def predict(self, prompt_tokens: int) -> float:
        return self.base_s + self.per_token_s * prompt_tokens


def line(fit: Fit, slope: float | None = None) -> tuple[float, float]:
    """(base, per_token) of the physical fit (``policies.latency``'s docstring), through
    the fit's mean point with its own slope or ``slope`` (the slow fit's, for the fast
    one: see ``policies.latency``)."""
    slope = fit.slope if slope is None else slope
    base = fit.mean_y - slope * fit.mean_x
    if base < 0:
        slope, base = (fit.mean_y / fit.mean_x if fit.mean_x > 0 else 0.0), 0.0
    return base, slope


def learn(
    fit: Fit,
    tokens: float,
    seconds: float,
    a: float,
    prior_tokens: float,
    err2: float | None = None,
    slope: float | None = None,
    at: float = 0.0,
) -> None:
    """Fold one sample, taken at clock time ``at``, into ``fit`` (its error first, against
    the fit before the sample, drawn with ``slope`` when given: the line that predicts).
    ``err2``: the squared log error to count, when it is known better than from
    ``seconds`` (a censored sample's expected one, ``censored``)."""
    base, slope = line(fit, slope)
    band = spread_band(tokens)
    fit.band_at[band] = at
    fit.max_x = max(fit.max_x, tokens)
    predicted = base + slope * tokens
    ratio = seconds / predicted if predicted > 0 else 0.0
    if fit.weight > 0 and 0 < ratio < math.inf:  # a log error needs both sides positive
        error2 = math.log(ratio) ** 2 if err2 is None else err2
        fit.err_weight = (1 - a) * fit.err_weight + a
        fit.err2 += a / fit.err_weight * (error2 - fit.err2)
        fit.band_weight[band] = (1 - a) * fit.band_weight[band] + a
        fit.band_err2[band] += a / fit.band_weight[band] * (error2 - fit.band_err2[band])
    fit.weight = (1 - a) * fit.weight + a
    share = a / fit.weight  # 1 for the first sample, 1/2 (nearly) for the second ...
    # Incremental exponentially weighted (co)variance (West 1979): no cancellation.
    dx, dy = tokens - fit.mean_x, seconds - fit.mean_y
    fit.mean_x += share * dx
    fit.mean_y += share * dy
    fit.var_x = (1 - share) * (fit.var_x + share * dx * dx)
    fit.cov_xy = (1 - share) * (fit.cov_xy + share * dx * dy)
    # Ridge towards the slope known so far: wide-ranging prompts (var >> prior) set it
    # from the data; prompts of nearly one length leave it nearly where it was, so a
    # target that now only sees short prompts still knows what long ones cost.
    prior = prior_tokens**2
    if fit.var_x + prior > 0:
        fit.slope = max(0.0, (fit.cov_xy + prior * fit.slope) / (fit.var_x + prior))


def beyond_reach(fit: Fit, tokens: float, margin: float) -> bool:
    """Whether a prompt of ``tokens`` is longer than those ``fit`` has seen (their mean
    plus two standard deviations) by more than ``margin``: predicting it extrapolates the
    slope. One-sided: the slope starts at 0 and the ridge keeps what it learnt, so a slope
    not yet learnt errs low, on long prompts, while a short prompt after long ones meets
    a slope already learnt. ``policies.latency`` keeps such samples from the load curve
    and the overdue watch: end to end at start-up, premium's first 3,800- and
    4,900-token answers, after chat prompts only, took 0.6-0.8 s against ~0.43 s
    predicted, at a new high of in-flight requests, and read as load (premium has no
    queue at all)."""
    return tokens > _usual_tokens(fit) + margin


def reach_tokens(fit: Fit, margin: float) -> float:
    """The longest prompt ``fit``'s slope is known for, plus ``margin``: the longest it has
    learnt from, or its usual ones' reach (``beyond_reach``) if further. Unlike
    ``beyond_reach`` it does not fade as long prompts grow rare: the ridge keeps the
    slope they taught (end to end, premium's usual prompts reached 2,900-4,100 tokens at
    times, replayed from what it served, after it had learnt from 6,000-token ones)."""
    return max(_usual_tokens(fit), fit.max_x) + margin


def _usual_tokens(fit: Fit) -> float:
    """The mean of the prompts ``fit`` has seen plus two standard deviations."""
    return fit.mean_x + 2.0 * math.sqrt(max(fit.var_x, 0.0))


def spread_of(fit: Fit) -> float | None:
    return math.sqrt(fit.err2) if fit.err_weight > 0 else None


def model_of(
    fit: Fit,
    alpha: float,
    slope: float | None = None,
    *,
    now: float = 0.0,
    half_life_s: float = BAND_HALF_LIFE_S,
) -> TtftModel:
    """``fit``'s model (its line drawn with ``slope`` when given, as ``line``), with its
    bands' errors counted at the fit's ``alpha``, each band's count halving every
    ``half_life_s`` since its last sample (at clock time ``now``): see ``band_spreads``."""
    bands = tuple(
        (_faded(checked_samples(weight, alpha), at, now, half_life_s), err2)
        for weight, err2, at in zip(fit.band_weight, fit.band_err2, fit.band_at, strict=True)
    )
    return TtftModel(*line(fit, slope), spread_of(fit), bands)


def _faded(checked: float, at: float | None, now: float, half_life_s: float) -> float:
    """``checked`` samples last added to at ``at`` (None: never), halved every
    ``half_life_s`` since."""
    return 0.0 if at is None else checked * 0.5 ** (max(0.0, now - at) / half_life_s)


# What a target's spread is believed to be before its own errors say (log TTFT spread of a
# typical API, 0.3-0.6), and how many checked samples that belief counts as. A target
# measured once or twice had no spread (its tail was its mean) or a tiny one (two close
# samples), so a cheap target lucky twice at start-up looked certain to meet 3 s and
# missed; end to end, most of the misses left came from the first ten seconds.
PRIOR_SPREAD = 0.5
PRIOR_SAMPLES = 3.0


def routing_spread(spread: float | None, checked: float) -> float:
    """The spread routing uses: the measured one (None: not checked yet) pooled with the
    prior as ``PRIOR_SAMPLES`` more samples, over ``checked`` samples' worth of errors."""
    measured = (spread or 0.0) ** 2 * checked
    return math.sqrt((measured + PRIOR_SPREAD**2 * PRIOR_SAMPLES) / (checked + PRIOR_SAMPLES))


def band_spreads(
    overall: float, measured: float | None, bands: tuple[tuple[float, float], ...]
) -> tuple[float, ...]:
    """The spread routing uses per band of prompt lengths: the target's ``overall``
    routing spread scaled by how far its band's errors are from all of them
    (``measured``, the RMS over every band), that ratio shrunk towards 1 as if
    ``PRIOR_SAMPLES`` more samples had matched the whole: with ``checked`` samples in
    the band, ``overall^2 x (err2 / measured^2) ^ (checked / (checked + PRIOR_SAMPLES))``.
    A band never seen, or one holding every sample, reads ``overall`` exactly (so the
    prior's pull at start-up is ``routing_spread``'s, not counted twice). A band's count
    fades while it gets no samples (``model_of``): a band learns only from its own
    prompts, and a target that looked erratic on long prompts gets none, so its long-prompt
    spread stayed where its first, worst errors left it (end to end, `mid`'s read 0.46-0.52
    for a minute, the menu's ~0.35, and kept it off 3 s RAG).

    Why per band: one spread for every prompt length is the RMS over all of them, while
    a long prompt's TTFT is a noisy start plus a steadier prefill (the end-to-end
    benchmark's menu: log-normal starts plus 0.05 ms per prompt token), so a long
    prompt's tail read too long: offline, on a premium-like target, the p99 drawn with
    the overall spread was exceeded by 0-0.6% of long prompts, with the band's by
    0.7-1.8% (decision 0010, session 15)."""
    if not measured:
        return (overall,) * len(bands)
    return tuple(
        overall * (err2 / measured**2) ** (0.5 * checked / (checked + PRIOR_SAMPLES))
        if err2 > 0
        else overall
        for checked, err2 in bands
    )


def checked_samples(err_weight: float, alpha: float) -> float:
    """How many samples' errors stand behind an error average of decayed weight
    ``err_weight``: n while the weight warms up (1 - (1 - alpha)^n), then the
    exponential average's effective count."""
    effective = (2 - alpha) / alpha
    if err_weight <= 0:
        return 0.0
    if alpha >= 1 or err_weight >= 1:
        return effective
    return min(effective, math.log(1 - err_weight) / math.log(1 - alpha))


def _above(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def censored(predicted_s: float, waited_s: float, spread: float) -> tuple[float, float] | None:
    """(expected TTFT, expected squared log error) of a TTFT known to exceed ``waited_s``
    under a log-normal of mean ``predicted_s`` and log spread ``spread`` (see the module
    docstring); None when any input is not positive."""
    if not (predicted_s > 0 and waited_s > 0 and spread > 0):
        return None
    z = ttft_z(predicted_s, spread, waited_s)
    tail = _above(z)  # P(TTFT > waited)
    density = math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    if tail > 1e-12:
        mills = density / tail
        # E[TTFT | TTFT > w] of a log-normal: its mean x P(Z > z - spread) / P(Z > z).
        expected = predicted_s * _above(z - spread) / tail
    else:  # far in the tail both underflow: pdf(x) / x asymptotes, the wait times z/(z-s)
        mills = z + 1.0 / z
        expected = waited_s * z / (z - spread) if z > spread + 1 else waited_s
    # The log error is counted against the mean, as ``learn`` counts a sample's:
    # ln(TTFT / mean) = spread x Z - spread^2 / 2, Z truncated below at z.
    err2 = spread * spread * (1.0 + z * mills) - spread**3 * mills + spread**4 / 4
    return expected, err2
