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
is the prediction, with one exception: its slope is the slow fit's. The slope is what
prefill costs per token, which changes rarely, while the fast fit sees few long prompts:
fitted on its own, over 3,000 samples of a premium-like target (a quarter of them
4,000-token prompts), its slope ranged from 0.012 to 0.068 ms per token and the prediction
for a long prompt swung by 10-12% (standard deviation), against 6-7% with the slow slope; the
level (the line's mean point) still follows the last few samples. As the fast fit's last
sample ages, the prediction relaxes towards the slow one
(the fast fit's weight halves every ``relax_half_life_s``). A couple of slow answers then
steer traffic away for a while, not until the estimate expires: a target nobody routes
to drifts back to what it has been over the longer run, and gets traffic (and samples)
again. ``None`` for ``relax_half_life_s`` keeps the fast fit alone.

Load. Each TTFT sample may come with the number of requests the gateway already had in
flight at the target when it was sent; ``policies.load.LoadCurve`` learns the TTFT
multiplier per in-flight count from those, and the fits learn from samples divided by
their multiplier, i.e. the target's no-load TTFT. (The multiplier routing reads: only the
part of a band's slow-down beyond one standard error, so a queued band with few samples
still passes some of its wait to the fit. Dividing by the full estimate instead, with the
first sample's band as the curve's reference, made predictions under load optimistic:
end to end, seeds 1-4, `slo`'s excess misses without a feed went from 9 to 44.)

Two things keep the split between "slower target" and "queue" identifiable. A sample sent
at a band of in-flight counts the curve has no sample of, above its least-loaded one
(``LoadCurve.unmapped``: the multiplier there is a guess), teaches the curve only: end to
end, the local box's first samples came with a start-up burst of up to 13 in flight, each
at a new band, and went into its no-load fit as they were (base 0.25 -> 4.9 s in 15 s;
the box then went unused for the rest of the run). And a cut sent where the curve reads
the target slowed is no censored sample: its wait is the queue's. A prompt longer than
the slow fit has seen (``ttft_fit.beyond_reach``) teaches the fits only and is not
watched for being overdue: its error is the unlearnt slope's, not load.

``health(label, in_flight)`` hands the strategies the multiplier for the count there is
now, or the larger one that attempts still waiting past their p99 imply
(``policies.overdue``: a queue seen before it answers), and the wait for a slot where the
target's slots are inferred (``policies.slots``: answers streaming while another waits).

Cuts. An attempt cut at its first-token deadline is no sample (its TTFT is only known to
exceed the wait). Each is evidence towards the cut penalty (``policies.cuts``: one cut
past the target's p99, or two past its p90, since its last real sample start it); a cut
short of that, while no penalty runs, is part of the target's ordinary spread and the fits
learn it as a censored sample (``policies.ttft_fit.censored``), so a target often cut at
a tight deadline is not fitted on its quick answers alone, nor one that hangs on its
cuts. The fits' bookkeeping lives in ``policies.ttft_models``, their arithmetic in
``policies.ttft_fit``.
"""

from __future__ import annotations

import math
from typing import Any

from msgspec import Struct

from core.clock import Clock
from core.routing import TargetHealth, spread_band, ttft_exceeds_p, ttft_quantile_s
from policies.cuts import EVIDENCE, CutPenalties
from policies.load import LoadCurve
from policies.overdue import OVERDUE_Z, OverdueAttempts
from policies.slots import SlotQueues
from policies.ttft_fit import TtftModel, band_spreads, censored, routing_spread
from policies.ttft_models import TwoSpeedFits, stale

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
        self.max_age_s = max_age_s
        self.fits = TwoSpeedFits(
            clock, alpha, slow_alpha, max_age_s, relax_half_life_s, prior_tokens
        )
        self.load = LoadCurve(clock, load_alpha, max_age_s)
        self.cuts = CutPenalties(clock)
        self.overdue = OverdueAttempts(clock)
        self.slots = SlotQueues(clock)
        self._ttft: dict[str, _Ewma] = {}
        self._tpot: dict[str, _Ewma] = {}

    def _update(self, table: dict[str, _Ewma], label: str, sample: float) -> None:
        now = self._clock.now()
        current = table.get(label)
        if current is None or stale(current.at, now, self.max_age_s):
            table[label] = _Ewma(sample, now)
            return
        current.value = self.alpha * sample + (1 - self.alpha) * current.value
        current.at = now

    def _read(self, table: dict[str, _Ewma], label: str) -> float | None:
        ewma = table.get(label)
        if ewma is None or stale(ewma.at, self._clock.now(), self.max_age_s):
            return None
        return ewma.value

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
        self.cuts.sampled(label, prompt_tokens, in_flight)
        factor = 1.0
        if in_flight is not None:
            factor = self.load.factor(label, in_flight)
            unmapped = self.load.unmapped(label, in_flight)
            model = self.ttft_model(label)
            if (
                model is not None
                and prompt_tokens is not None
                and not self._extrapolated(label, prompt_tokens)
            ):
                self.load.observe(label, in_flight, seconds, model.predict(prompt_tokens))
            if unmapped:
                return
        no_load = seconds / factor
        self._update(self._ttft, label, no_load)
        if prompt_tokens is not None and prompt_tokens >= 0:
            self.fits.learn(label, float(prompt_tokens), no_load)

    def _slowed(self, label: str, in_flight: int) -> bool:
        """Whether the load curve reads ``label`` slowed at ``in_flight`` (or does not know
        that band): a sample sent there is evidence of load, not of the no-load TTFT."""
        return self.load.factor(label, in_flight) > 1.0 or self.load.unmapped(label, in_flight)

    def _extrapolated(self, label: str, prompt_tokens: int) -> bool:
        """Whether ``label``'s prediction for ``prompt_tokens`` extrapolates its slope
        (``TwoSpeedFits.extrapolated``): its error is then no evidence of load (see the
        module docstring)."""
        return self.fits.extrapolated(label, prompt_tokens)

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
        ages = [self.cuts.age_s(label), self.fits.age_s(label)]
        return min((age for age in ages if age is not None), default=None)

    def ttft_model(self, label: str) -> TtftModel | None:
        """The TTFT model at no load (``TwoSpeedFits.model``): None before any sample with
        prompt tokens (or when stale)."""
        return self.fits.model(label)

    def health(self, label: str, in_flight: int = 0) -> TargetHealth:
        """The latency fields of ``label``'s ``TargetHealth`` (the rest at their defaults)
        with ``in_flight`` requests at the target now: what the gateway and the routing
        simulator both hand the strategies."""
        ttft, tpot = self.estimate(label)
        model = self.ttft_model(label)
        load, knee = self.load.read(label, in_flight)
        factor = max(load, self.overdue.factor(label, in_flight))
        penalty, floor, from_tokens, from_in_flight = self.cuts.read(label)
        self.slots.confirm(label, self.overdue.queued(label))
        service = model.base_s if model is not None else ttft
        queue = self.slots.wait_s(label, service) if service is not None else 0.0
        if model is None:
            return TargetHealth(
                ttft_s=ttft,
                tpot_s=tpot,
                in_flight=in_flight,
                ttft_load_factor=factor,
                ttft_queue_s=queue,
                ttft_age_s=self.sample_age(label) if floor is not None else None,
                ttft_penalty=penalty,
                ttft_floor_s=floor,
                ttft_penalty_from_tokens=from_tokens,
                ttft_penalty_from_in_flight=from_in_flight,
                ttft_penalty_age_s=self.cuts.age_s(label),
            )
        spread = self._routing_spread(label, model)
        return TargetHealth(
            ttft_s=ttft,
            tpot_s=tpot,
            ttft_base_s=model.base_s,
            ttft_per_token_s=model.per_token_s,
            ttft_spread=spread,
            ttft_band_spreads=band_spreads(spread, model.spread, model.bands),
            in_flight=in_flight,
            ttft_load_factor=factor,
            ttft_queue_s=queue,
            ttft_load_seen=self.load.most_seen(label),
            ttft_load_knee=knee,
            ttft_age_s=self.sample_age(label),
            ttft_band_ages_s=self.fits.band_ages_s(label),
            **self._steady(label),
            ttft_penalty=penalty,
            ttft_floor_s=floor,
            ttft_penalty_from_tokens=from_tokens,
            ttft_penalty_from_in_flight=from_in_flight,
            ttft_penalty_age_s=self.cuts.age_s(label),
        )

    def attempt_started(
        self, label: str, *, prompt_tokens: int | None = None, in_flight: int | None = None
    ) -> int | None:
        """An attempt sent with ``in_flight`` others at ``label``: registered as waiting
        for its first token (``policies.overdue``) when the target is measured and the
        prompt known. Returns the ticket ``attempt_finished`` takes back (None: none)."""
        predicted = self._predicted(label, prompt_tokens, in_flight or 0)
        if predicted is None or self._extrapolated(label, prompt_tokens or 0):
            return None
        expected, spread, factor = predicted
        p99_s = ttft_quantile_s(expected, spread, OVERDUE_Z)
        return self.overdue.start(label, p99_s, factor, in_flight or 0)

    def attempt_finished(
        self,
        label: str,
        *,
        error: str | None,
        ttft_s: float | None,
        retryable: bool,
        prompt_tokens: int | None = None,
        in_flight: int | None = None,
        ticket: int | None = None,
    ) -> None:
        """The attempt of ``ticket`` (from ``attempt_started``) waits no more. Successful
        attempts with a time are TTFT samples (with ``prompt_tokens``, for
        the TTFT model too; with ``in_flight``, for the load curve); attempts cut at their
        deadline (``AttemptDeadlineError``) add to the target's cut evidence (``policies.
        cuts``: more than the wait, by how much nobody knows) and, when not evidence
        enough on their own (surprise below ``EVIDENCE``: ahead of the target's p99) and
        no penalty runs, are censored samples of its TTFT model (``policies.ttft_fit.
        censored``); failures are not latency."""
        self.overdue.finish(ticket)
        if ttft_s is None:
            return
        if error is None:
            self.observe_ttft(label, ttft_s, prompt_tokens, in_flight)
        elif error == CUT_ERROR:
            surprise = self.cut_surprise(label, ttft_s, prompt_tokens, in_flight)
            # Ordinary: not itself evidence, and no penalty running (a target that hangs
            # is cut again and again; learnt as samples, its cuts made `mid`'s no-load
            # TTFT read 2.0 s, its true 1.2 s, for minutes after a 20 s hang).
            ordinary = surprise < EVIDENCE and self.cuts.read(label)[0] <= 1.0
            self.cuts.cut(label, ttft_s, prompt_tokens or 0, surprise, in_flight or 0)
            if ordinary:
                self._learn_censored(label, ttft_s, prompt_tokens, in_flight or 0)

    def _learn_censored(
        self, label: str, waited_s: float, prompt_tokens: int | None, in_flight: int
    ) -> None:
        """Fold a TTFT known to exceed ``waited_s`` into the fits, at what the model expects
        of it, unless it was sent where the curve reads the target slowed (or does not
        know the band: the wait is then the queue's); the load curve and penalty are
        untouched."""
        predicted = self._predicted(label, prompt_tokens, in_flight)
        if predicted is None or prompt_tokens is None or self._slowed(label, in_flight):
            return
        expected, spread, _ = predicted
        moments = censored(expected, waited_s, spread)
        if moments is None:
            return
        seconds, err2 = moments
        self.fits.learn(label, float(prompt_tokens), seconds, err2)

    def cut_surprise(
        self, label: str, waited_s: float, prompt_tokens: int | None, in_flight: int | None
    ) -> float:
        """``-log10`` of the chance that ``label``, as measured, is still silent after
        ``waited_s`` (``policies.cuts``): its predicted TTFT for the prompt at that load,
        spread as strategies see it. Infinite when unmeasured (a cut is all there is)."""
        predicted = self._predicted(label, prompt_tokens, in_flight or 0)
        if predicted is None:
            return math.inf
        expected, spread, _ = predicted
        if expected <= 0 or waited_s <= 0 or spread <= 0:
            return math.inf if waited_s > expected else 0.0
        silent = ttft_exceeds_p(expected, spread, waited_s)
        return -math.log10(max(silent, 1e-12))

    def _predicted(
        self, label: str, prompt_tokens: int | None, in_flight: int
    ) -> tuple[float, float, float] | None:
        """(expected TTFT, spread, load factor) for a prompt sent at ``in_flight``, as
        strategies see them; None when unmeasured or the prompt is unknown."""
        model = self.ttft_model(label)
        if model is None or prompt_tokens is None:
            return None
        factor = self.load.factor(label, in_flight)
        overall = self._routing_spread(label, model)
        spread = band_spreads(overall, model.spread, model.bands)[spread_band(prompt_tokens)]
        return model.predict(prompt_tokens) * factor, spread, factor

    def _steady(self, label: str) -> dict[str, Any]:
        """The ``TargetHealth`` fields of ``label``'s slow fit (``TwoSpeedFits.steady``),
        its spreads as routing sees them over the samples it has checked."""
        steady = self.fits.steady(label)
        if steady is None:
            return {}
        overall = routing_spread(steady.spread, self.fits.checked(label, slow=True))
        return {
            "ttft_steady_base_s": steady.base_s,
            "ttft_steady_per_token_s": steady.per_token_s,
            "ttft_steady_band_spreads": band_spreads(overall, steady.spread, steady.bands),
            "ttft_steady_reach_tokens": self.fits.reach_tokens(label),
        }

    def _routing_spread(self, label: str, model: TtftModel) -> float:
        """``model``'s overall spread as strategies see it (``ttft_fit.routing_spread``),
        over the samples the fast fit has checked."""
        return routing_spread(model.spread, self.fits.checked(label))
