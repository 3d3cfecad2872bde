"""The TTFT models of every target at two speeds: the bookkeeping of ``policies.latency``'s
fits (its docstring says why there are two and how the prediction blends them); the
arithmetic of one fit is ``policies.ttft_fit``.

Contract: ``learn`` folds a no-load sample into both fits of a label, ``model`` reads the
blended prediction (None before any sample or once both fits are stale). Pure: time from
the injected clock.
"""

from __future__ import annotations

import msgspec

from core.clock import Clock
from policies.ttft_fit import (
    Fit,
    TtftModel,
    beyond_reach,
    checked_samples,
    learn,
    line,
    model_of,
    reach_tokens,
)


class TwoSpeedFits:
    """Per label, a fast fit (``alpha``, forgotten after ``max_age_s``) and a slow one
    (``slow_alpha``, kept twelve times as long) of the same samples; the fast fit predicts
    with the slow one's slope and relaxes towards it as its last sample ages (half-life
    ``relax_half_life_s``; None: the fast fit alone)."""

    def __init__(
        self,
        clock: Clock,
        alpha: float,
        slow_alpha: float,
        max_age_s: float | None,
        relax_half_life_s: float | None,
        prior_tokens: float,
    ) -> None:
        self._clock = clock
        self.alpha = alpha
        self.slow_alpha = slow_alpha
        self.max_age_s = max_age_s
        self.slow_max_age_s = None if max_age_s is None else 12 * max_age_s
        self.relax_half_life_s = relax_half_life_s
        self.prior_tokens = prior_tokens
        self.fast: dict[str, Fit] = {}
        self.slow: dict[str, Fit] = {}

    def learn(self, label: str, x: float, y: float, err2: float | None = None) -> None:
        """Fold (prompt tokens ``x``, no-load TTFT ``y``) into both fits; with ``err2`` a
        censored sample (``ttft_fit.censored``), which only refines fits there are."""
        self._fold(self.fast, label, x, y, slow=False, err2=err2)
        self._fold(self.slow, label, x, y, slow=True, err2=err2)

    def _fold(
        self, fits: dict[str, Fit], label: str, x: float, y: float, slow: bool, err2: float | None
    ) -> None:
        """A stale or missing fit starts afresh, except for a censored sample. The fast
        fit's error is measured against the line that predicts (the slow slope)."""
        now = self._clock.now()
        fit = fits.get(label)
        if fit is None or stale(fit.at, now, self.slow_max_age_s if slow else self.max_age_s):
            if err2 is not None:
                return
            fit = fits[label] = Fit(0.0, x, y, 0.0, 0.0, 0.0, 0.0, now)
        alpha = self.slow_alpha if slow else self.alpha
        slope = None if slow else self._slow_slope(label, now)
        learn(fit, x, y, alpha, self.prior_tokens, err2, slope, at=now)
        fit.at = now

    def _fresh_slow(self, label: str, now: float) -> Fit | None:
        slow = self.slow.get(label)
        return None if slow is None or stale(slow.at, now, self.slow_max_age_s) else slow

    def _slow_slope(self, label: str, now: float) -> float | None:
        """The slow fit's seconds per prompt token (None: no fresh slow fit)."""
        slow = self._fresh_slow(label, now)
        return None if slow is None else line(slow)[1]

    def model(self, label: str) -> TtftModel | None:
        """The no-load TTFT model: the fast fit, relaxed towards the slow one as it ages;
        None before any sample (or when stale)."""
        now = self._clock.now()
        slow = self._fresh_slow(label, now)
        fast = self.fast.get(label)
        if fast is None or stale(fast.at, now, self.max_age_s):
            return None if slow is None else model_of(slow, self.slow_alpha, now=now)
        model = model_of(fast, self.alpha, self._slow_slope(label, now), now=now)
        if slow is None or self.relax_half_life_s is None:
            return model
        weight = 0.5 ** ((now - fast.at) / self.relax_half_life_s)
        slow_base, slow_slope = line(slow)
        return msgspec.structs.replace(
            model,
            base_s=weight * model.base_s + (1 - weight) * slow_base,
            per_token_s=weight * model.per_token_s + (1 - weight) * slow_slope,
        )

    def age_s(self, label: str) -> float | None:
        """Seconds since the last sample of ``label`` (None: none, or the slow fit is
        forgotten)."""
        now = self._clock.now()
        slow = self._fresh_slow(label, now)
        return None if slow is None else now - slow.at

    def band_ages_s(self, label: str) -> tuple[float | None, ...]:
        """Seconds since the last sample of ``label`` per band of prompt lengths
        (``core.routing.SPREAD_BAND_EDGES``; None: none there), from the slow fit (empty:
        no fresh slow fit)."""
        now = self._clock.now()
        slow = self._fresh_slow(label, now)
        if slow is None:
            return ()
        return tuple(None if at is None else now - at for at in slow.band_at)

    def extrapolated(self, label: str, prompt_tokens: int) -> bool:
        """Whether a prediction for ``prompt_tokens`` extrapolates the slope
        (``ttft_fit.beyond_reach`` of the slow fit, by ``prior_tokens``)."""
        slow = self.slow.get(label)
        return slow is not None and beyond_reach(slow, prompt_tokens, self.prior_tokens)

    def reach_tokens(self, label: str) -> float | None:
        """The longest prompt ``label``'s slope is known for (``ttft_fit.reach_tokens`` of
        the slow fit, by ``prior_tokens``; None: no slow fit)."""
        slow = self.slow.get(label)
        return None if slow is None else reach_tokens(slow, self.prior_tokens)

    def steady(self, label: str) -> TtftModel | None:
        """The slow fit's own model (its line and its errors; None: no fresh slow fit):
        what the target has been over the longer run, for reserving it as a rescue."""
        now = self._clock.now()
        slow = self._fresh_slow(label, now)
        return None if slow is None else model_of(slow, self.slow_alpha, now=now)

    def checked(self, label: str, slow: bool = False) -> float:
        """How many samples' worth of out-of-sample error the fast (or slow) fit has
        measured."""
        fit = (self.slow if slow else self.fast).get(label)
        alpha = self.slow_alpha if slow else self.alpha
        return checked_samples(fit.err_weight, alpha) if fit is not None else 0.0


def stale(at: float, now: float, max_age_s: float | None) -> bool:
    """Whether something last updated ``at`` is older than ``max_age_s`` (None: never)."""
    return max_age_s is not None and now - at > max_age_s
