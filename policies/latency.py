"""Latency statistics per target, the inputs of the latency-aware strategies
(``routers.strategies.predict``). In-process: each replica measures what it sees.

Per target label:

- ``ttft_s``: EWMA of time to first token (TTFT), over every sample;
- ``tpot_s``: EWMA of time per output token;
- a TTFT *model*, fitted on the samples that come with their request's prompt tokens:
  TTFT = ``base_s`` + ``per_token_s`` x prompt tokens, by exponentially weighted least
  squares (a long prompt takes longer to prefill, so one mean TTFT per target under-
  predicts long prompts and over-predicts short ones);
- the model's ``spread``: the exponentially weighted root mean square of its log
  prediction error ``ln(actual / predicted)``, each error measured *before* its sample
  updates the fit. Out of sample, so it is honest: a fit that is still poorly determined,
  or a target whose latency is erratic, shows a wide spread. In logs, because latency
  noise is multiplicative (a 20 s prefill varies by seconds where a 0.2 s one varies by
  tens of milliseconds) and one huge outlier moves a log error far less than a ratio.

All averages weigh a sample ``alpha`` against ``1 - alpha`` for what came before. The
plain EWMAs take their first sample as is; the fit and the spread start as even averages
of their first samples (the decayed sum of weights starts at 0, as in a bias-corrected
EWMA), so neither the first sample nor the first error is taken as the truth.

The fit's slope is ridge-regularised towards the slope known before the sample:
``slope = (cov(x, y) + prior_tokens**2 x old slope) / (var(x) + prior_tokens**2)``
(starting from 0). Prompts that spread over much more than ``prior_tokens`` set the slope
from the data; prompts that barely vary in length can neither fake a steep slope out of
noise nor make the fit forget a slope learnt earlier (the exponential forgetting shrinks
var(x) when a target sees one kind of prompt only, e.g. because long prompts are routed
elsewhere; a plain ridge towards 0 would then flatten the line and send the next long
prompt back to a target that cannot serve it in time). The base follows the recent
samples: the line goes through their weighted mean. It is kept physical: a negative slope
becomes 0 (a longer prompt never starts faster), and a negative base makes the line go
through the origin and the mean point instead.

Estimates not updated for ``max_age_s`` (default 300 s) are forgotten: they read as None,
"unmeasured", so strategies explore the target again. Without this a target measured
slow once (or with an unlucky spread) is never chosen, hence never measured, again.

Two speeds. Beside the fit above (``alpha``) a slow one (``slow_alpha``, kept for
``slow_max_age_s``) learns from the same samples. While samples keep coming the fast fit
is the prediction; as its last sample ages, the prediction relaxes towards the slow one
(the fast fit's weight halves every ``relax_half_life_s``). A couple of slow answers then
steer traffic away for a while, not until the estimate expires: a target nobody routes
to drifts back to what it has been over the longer run, and gets traffic (and samples)
again. ``None`` for ``relax_half_life_s`` keeps the fast fit alone.

Load. Each TTFT sample may come with the number of requests the gateway already had in
flight at the target when it was sent; ``policies.load.LoadCurve`` learns the TTFT
multiplier per in-flight count from those, and the fits learn from samples divided by
their multiplier, i.e. the target's no-load TTFT. ``health(label, in_flight)`` hands the
strategies the multiplier for the count there is now.
"""

from __future__ import annotations

import math

from msgspec import Struct

from core.clock import Clock
from core.routing import TargetHealth
from policies.cuts import CutPenalties
from policies.load import LoadCurve

DEFAULT_MAX_AGE_S = 300.0
CUT_ERROR = "AttemptDeadlineError"  # core.errors: an attempt cut at its first-token deadline
# About 19 samples: with alpha 0.2 (9) a target with a log-normal spread of 0.4 had its
# predicted p90 swing from 1.7 to 3.4 s around a true 2.0 s (over 3 s 13% of the time, so
# its 3 s requests went to a dearer target); 0.1 keeps it within 1.8-2.9 s and still
# shows a doubling within 3 samples (the out-of-sample spread jumps at once).
DEFAULT_ALPHA = 0.1
DEFAULT_SLOW_ALPHA = 0.02
DEFAULT_LOAD_ALPHA = 0.2  # the load curve's bands: each sees few samples, queues move fast
DEFAULT_RELAX_HALF_LIFE_S = 30.0


class _Ewma(Struct):
    value: float
    at: float  # clock.now() of the last sample


class _Fit(Struct):
    """Exponentially weighted moments of (prompt tokens x, TTFT y) and the mean square log
    prediction error; ``weight`` and ``err_weight`` are the decayed sums of the sample
    weights (from 0: the warm-up)."""

    weight: float
    mean_x: float
    mean_y: float
    var_x: float
    cov_xy: float
    err_weight: float
    err2: float
    at: float  # clock.now() of the last sample
    slope: float = 0.0  # seconds per prompt token, remembered (see ``_fit``)


class TtftModel(Struct, frozen=True):
    """TTFT = ``base_s`` + ``per_token_s`` x prompt tokens; ``spread`` is the RMS log
    prediction error (None until a prediction has been checked)."""

    base_s: float
    per_token_s: float
    spread: float | None

    def predict(self, prompt_tokens: int) -> float:
        return self.base_s + self.per_token_s * prompt_tokens


def _line(fit: _Fit) -> tuple[float, float]:
    """(base, per_token) of the physical fit (see the module docstring)."""
    slope = fit.slope
    base = fit.mean_y - slope * fit.mean_x
    if base < 0:
        slope, base = (fit.mean_y / fit.mean_x if fit.mean_x > 0 else 0.0), 0.0
    return base, slope


def _learn(fit: _Fit, tokens: float, seconds: float, a: float, prior_tokens: float) -> None:
    """Fold one sample into ``fit`` (its error first, against the fit before the sample)."""
    base, slope = _line(fit)
    predicted = base + slope * tokens
    ratio = seconds / predicted if predicted > 0 else 0.0
    if fit.weight > 0 and 0 < ratio < math.inf:  # a log error needs both sides positive
        error = math.log(ratio)
        fit.err_weight = (1 - a) * fit.err_weight + a
        fit.err2 += a / fit.err_weight * (error * error - fit.err2)
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


def _spread(fit: _Fit) -> float | None:
    return math.sqrt(fit.err2) if fit.err_weight > 0 else None


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


def _checked(fit: _Fit, alpha: float) -> float:
    """How many samples' errors ``fit``'s spread stands on: n while the decayed weight
    warms up (1 - (1 - alpha)^n), then the exponential average's effective count."""
    effective = (2 - alpha) / alpha
    if fit.err_weight <= 0:
        return 0.0
    if alpha >= 1 or fit.err_weight >= 1:
        return effective
    return min(effective, math.log(1 - fit.err_weight) / math.log(1 - alpha))


class LatencyStats:
    """EWMAs of TTFT and TPOT, TTFT models at two speeds and a load curve per target label
    (see the module docstring). Implements ``AttemptObserver``: a successful attempt's
    ``ttft_s`` is a TTFT sample (for a non-streamed call, the time to the whole answer)."""

    def __init__(
        self,
        clock: Clock,
        alpha: float = DEFAULT_ALPHA,
        max_age_s: float | None = DEFAULT_MAX_AGE_S,
        *,
        prior_tokens: float = 1000.0,
        slow_alpha: float = DEFAULT_SLOW_ALPHA,
        load_alpha: float = DEFAULT_LOAD_ALPHA,
        relax_half_life_s: float | None = DEFAULT_RELAX_HALF_LIFE_S,
    ) -> None:
        if not (0 < alpha <= 1 and 0 < slow_alpha <= 1):
            raise ValueError("alpha must be in (0, 1]")
        if prior_tokens < 0:
            raise ValueError("prior_tokens must be >= 0")
        self._clock = clock
        self.alpha = alpha
        self.slow_alpha = slow_alpha
        self.max_age_s = max_age_s
        self.slow_max_age_s = None if max_age_s is None else 12 * max_age_s
        self.relax_half_life_s = relax_half_life_s
        self.prior_tokens = prior_tokens
        self.load = LoadCurve(clock, load_alpha, max_age_s)
        self.cuts = CutPenalties(clock)
        self._ttft: dict[str, _Ewma] = {}
        self._tpot: dict[str, _Ewma] = {}
        self._fits: dict[str, _Fit] = {}
        self._slow: dict[str, _Fit] = {}

    def _update(self, table: dict[str, _Ewma], label: str, sample: float) -> None:
        now = self._clock.now()
        current = table.get(label)
        if current is None or _stale(current.at, now, self.max_age_s):
            table[label] = _Ewma(sample, now)
            return
        current.value = self.alpha * sample + (1 - self.alpha) * current.value
        current.at = now

    def _read(self, table: dict[str, _Ewma], label: str) -> float | None:
        ewma = table.get(label)
        if ewma is None or _stale(ewma.at, self._clock.now(), self.max_age_s):
            return None
        return ewma.value

    def _fit(self, fits: dict[str, _Fit], label: str, x: float, y: float, slow: bool) -> None:
        now = self._clock.now()
        fit = fits.get(label)
        if fit is None or _stale(fit.at, now, self.slow_max_age_s if slow else self.max_age_s):
            fit = fits[label] = _Fit(0.0, x, y, 0.0, 0.0, 0.0, 0.0, now)
        _learn(fit, x, y, self.slow_alpha if slow else self.alpha, self.prior_tokens)
        fit.at = now

    def observe_ttft(
        self,
        label: str,
        seconds: float,
        prompt_tokens: int | None = None,
        in_flight: int | None = None,
    ) -> None:
        """One time-to-first-token sample (negative samples are ignored). With the
        request's ``prompt_tokens`` (>= 0) it also updates the TTFT models; with the
        ``in_flight`` count it was sent at, the load curve too (see the docstring). It
        clears the target's cut penalty (``policies.cuts``)."""
        if seconds < 0:
            return
        self.cuts.sampled(label, prompt_tokens)
        factor = 1.0
        if in_flight is not None:
            factor = self.load.factor(label, in_flight)
            model = self.ttft_model(label)
            if model is not None and prompt_tokens is not None:
                self.load.observe(label, in_flight, seconds, model.predict(prompt_tokens))
        no_load = seconds / factor
        self._update(self._ttft, label, no_load)
        if prompt_tokens is not None and prompt_tokens >= 0:
            x = float(prompt_tokens)
            self._fit(self._fits, label, x, no_load, slow=False)
            self._fit(self._slow, label, x, no_load, slow=True)

    def observe_tokens(self, label: str, tokens: int, seconds: float) -> None:
        """``tokens`` output tokens generated in ``seconds`` after the first one; one TPOT
        sample of ``seconds / tokens``. Ignored without tokens or with negative time."""
        if tokens > 0 and seconds >= 0:
            self._update(self._tpot, label, seconds / tokens)

    def estimate(self, label: str) -> tuple[float | None, float | None]:
        """(TTFT seconds, TPOT seconds); None where there is no fresh data."""
        return self._read(self._ttft, label), self._read(self._tpot, label)

    def sample_age(self, label: str) -> float | None:
        """Seconds since the last thing learnt of ``label``: a TTFT sample with prompt
        tokens or a cut attempt (None: neither, or so long ago that both fits are
        forgotten and the penalty has decayed)."""
        fit = self._slow.get(label)
        ages = [self.cuts.age_s(label)]
        if fit is not None and not _stale(fit.at, self._clock.now(), self.slow_max_age_s):
            ages.append(self._clock.now() - fit.at)
        known = [age for age in ages if age is not None]
        return min(known) if known else None

    def ttft_model(self, label: str) -> TtftModel | None:
        """The TTFT model at no load: the fast fit, relaxed towards the slow one as it ages
        (see the docstring); None before any sample with prompt tokens (or when stale)."""
        now = self._clock.now()
        slow = self._slow.get(label)
        if slow is None or _stale(slow.at, now, self.slow_max_age_s):
            slow = None
        fast = self._fits.get(label)
        if fast is None or _stale(fast.at, now, self.max_age_s):
            return None if slow is None else TtftModel(*_line(slow), _spread(slow))
        base, slope = _line(fast)
        if slow is not None and self.relax_half_life_s is not None:
            weight = 0.5 ** ((now - fast.at) / self.relax_half_life_s)
            slow_base, slow_slope = _line(slow)
            base = weight * base + (1 - weight) * slow_base
            slope = weight * slope + (1 - weight) * slow_slope
        return TtftModel(base, slope, _spread(fast))

    def health(self, label: str, in_flight: int = 0) -> TargetHealth:
        """The latency fields of ``label``'s ``TargetHealth`` (the rest at their defaults)
        with ``in_flight`` requests at the target now: what the gateway and the routing
        simulator both hand the strategies."""
        ttft, tpot = self.estimate(label)
        model = self.ttft_model(label)
        factor = self.load.factor(label, in_flight)
        penalty, floor, from_tokens = self.cuts.read(label)
        if model is None:
            return TargetHealth(
                ttft_s=ttft,
                tpot_s=tpot,
                in_flight=in_flight,
                ttft_load_factor=factor,
                ttft_age_s=self.sample_age(label) if floor is not None else None,
                ttft_penalty=penalty,
                ttft_floor_s=floor,
                ttft_penalty_from_tokens=from_tokens,
                ttft_penalty_age_s=self.cuts.age_s(label),
            )
        fit = self._fits.get(label)
        checked = _checked(fit, self.alpha) if fit is not None else 0.0
        return TargetHealth(
            ttft_s=ttft,
            tpot_s=tpot,
            ttft_base_s=model.base_s,
            ttft_per_token_s=model.per_token_s,
            ttft_spread=routing_spread(model.spread, checked),
            in_flight=in_flight,
            ttft_load_factor=factor,
            ttft_age_s=self.sample_age(label),
            ttft_penalty=penalty,
            ttft_floor_s=floor,
            ttft_penalty_from_tokens=from_tokens,
            ttft_penalty_age_s=self.cuts.age_s(label),
        )

    def attempt_started(self, label: str) -> None:
        """Nothing to do before a call."""

    def attempt_finished(
        self,
        label: str,
        *,
        error: str | None,
        ttft_s: float | None,
        retryable: bool,
        prompt_tokens: int | None = None,
        in_flight: int | None = None,
    ) -> None:
        """Successful attempts with a time are TTFT samples (with ``prompt_tokens``, for
        the TTFT model too; with ``in_flight``, for the load curve); attempts cut at their
        deadline (``AttemptDeadlineError``) raise the target's cut penalty (``policies.cuts``:
        more than the wait, by how much nobody knows, so not a sample); failures are not
        latency."""
        if ttft_s is None:
            return
        if error is None:
            self.observe_ttft(label, ttft_s, prompt_tokens, in_flight)
        elif error == CUT_ERROR:
            surprise = self.cut_surprise(label, ttft_s, prompt_tokens, in_flight)
            self.cuts.cut(label, ttft_s, prompt_tokens or 0, surprise)

    def cut_surprise(
        self, label: str, waited_s: float, prompt_tokens: int | None, in_flight: int | None
    ) -> float:
        """``-log10`` of the chance that ``label``, as measured, is still silent after
        ``waited_s`` (``policies.cuts``): its predicted TTFT for the prompt at that load,
        spread as strategies see it. Infinite when unmeasured (a cut is all there is)."""
        model = self.ttft_model(label)
        if model is None or prompt_tokens is None:
            return math.inf
        expected = model.predict(prompt_tokens) * self.load.factor(label, in_flight or 0)
        fit = self._fits.get(label)
        spread = routing_spread(model.spread, _checked(fit, self.alpha) if fit else 0.0)
        if expected <= 0 or waited_s <= 0 or spread <= 0:
            return math.inf if waited_s > expected else 0.0
        z = math.log(waited_s / expected) / spread
        silent = 0.5 * math.erfc(z / math.sqrt(2.0))  # P(TTFT > waited)
        return -math.log10(max(silent, 1e-12))


def _stale(at: float, now: float, max_age_s: float | None) -> bool:
    return max_age_s is not None and now - at > max_age_s
