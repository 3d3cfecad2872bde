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
"""

from __future__ import annotations

import math

from msgspec import Struct

from core.clock import Clock
from core.routing import TargetHealth

DEFAULT_MAX_AGE_S = 300.0


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


class LatencyStats:
    """EWMAs of TTFT and TPOT and a TTFT model per target label (see the module docstring).
    Implements ``AttemptObserver``: a successful attempt's ``ttft_s`` is a TTFT sample (for
    a non-streamed call, the time to the whole answer)."""

    def __init__(
        self,
        clock: Clock,
        alpha: float = 0.2,
        max_age_s: float | None = DEFAULT_MAX_AGE_S,
        *,
        prior_tokens: float = 1000.0,
    ) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        if prior_tokens < 0:
            raise ValueError("prior_tokens must be >= 0")
        self._clock = clock
        self.alpha = alpha
        self.max_age_s = max_age_s
        self.prior_tokens = prior_tokens
        self._ttft: dict[str, _Ewma] = {}
        self._tpot: dict[str, _Ewma] = {}
        self._fits: dict[str, _Fit] = {}

    def _update(self, table: dict[str, _Ewma], label: str, sample: float) -> None:
        now = self._clock.now()
        current = table.get(label)
        if current is None or self._stale(current.at, now):
            table[label] = _Ewma(sample, now)
            return
        current.value = self.alpha * sample + (1 - self.alpha) * current.value
        current.at = now

    def _stale(self, at: float, now: float) -> bool:
        return self.max_age_s is not None and now - at > self.max_age_s

    def _read(self, table: dict[str, _Ewma], label: str) -> float | None:
        ewma = table.get(label)
        if ewma is None or self._stale(ewma.at, self._clock.now()):
            return None
        return ewma.value

    def _fit(self, label: str, tokens: float, seconds: float) -> None:
        now, a = self._clock.now(), self.alpha
        fit = self._fits.get(label)
        if fit is None or self._stale(fit.at, now):
            fit = self._fits[label] = _Fit(0.0, tokens, seconds, 0.0, 0.0, 0.0, 0.0, now)
        else:
            base, slope = _line(fit)
            predicted = base + slope * tokens
            ratio = seconds / predicted if predicted > 0 else 0.0
            if 0 < ratio < math.inf:  # a log error needs both sides positive (and finite)
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
        # Ridge towards the slope known so far: wide-ranging prompts (var >> prior) set
        # it from the data; prompts of nearly one length leave it nearly where it was,
        # so a target that now only sees short prompts still knows what long ones cost.
        prior = self.prior_tokens**2
        if fit.var_x + prior > 0:
            fit.slope = max(0.0, (fit.cov_xy + prior * fit.slope) / (fit.var_x + prior))
        fit.at = now

    def observe_ttft(self, label: str, seconds: float, prompt_tokens: int | None = None) -> None:
        """One time-to-first-token sample (negative samples are ignored). With the
        request's ``prompt_tokens`` (>= 0) it also updates the TTFT model."""
        if seconds < 0:
            return
        self._update(self._ttft, label, seconds)
        if prompt_tokens is not None and prompt_tokens >= 0:
            self._fit(label, float(prompt_tokens), seconds)

    def observe_tokens(self, label: str, tokens: int, seconds: float) -> None:
        """``tokens`` output tokens generated in ``seconds`` after the first one; one TPOT
        sample of ``seconds / tokens``. Ignored without tokens or with negative time."""
        if tokens > 0 and seconds >= 0:
            self._update(self._tpot, label, seconds / tokens)

    def estimate(self, label: str) -> tuple[float | None, float | None]:
        """(TTFT seconds, TPOT seconds); None where there is no fresh data."""
        return self._read(self._ttft, label), self._read(self._tpot, label)

    def ttft_model(self, label: str) -> TtftModel | None:
        """The fitted TTFT model, or None before any sample with prompt tokens (or when
        stale)."""
        fit = self._fits.get(label)
        if fit is None or self._stale(fit.at, self._clock.now()):
            return None
        base, slope = _line(fit)
        spread = math.sqrt(fit.err2) if fit.err_weight > 0 else None
        return TtftModel(base, slope, spread)

    def health(self, label: str) -> TargetHealth:
        """The latency fields of ``label``'s ``TargetHealth`` (the rest at their defaults):
        what the gateway and the routing simulator both hand the strategies."""
        ttft, tpot = self.estimate(label)
        model = self.ttft_model(label)
        if model is None:
            return TargetHealth(ttft_s=ttft, tpot_s=tpot)
        return TargetHealth(
            ttft_s=ttft,
            tpot_s=tpot,
            ttft_base_s=model.base_s,
            ttft_per_token_s=model.per_token_s,
            ttft_spread=model.spread,
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
    ) -> None:
        """Successful attempts with a time are TTFT samples (with ``prompt_tokens``, for
        the TTFT model too); failures are not latency."""
        if error is None and ttft_s is not None:
            self.observe_ttft(label, ttft_s, prompt_tokens)
