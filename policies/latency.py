"""Latency statistics per target: exponentially weighted moving averages of time to first
token (TTFT) and time per output token (TPOT), the inputs of the latency-aware strategies
(``routers.strategies.predict``). In-process: each replica measures what it sees.

EWMA: ``new = alpha * sample + (1 - alpha) * old``; the first sample is taken as is.
With ``max_age_s`` set, an estimate not updated for that long is forgotten (reads as None,
"unmeasured"), so a target that was slow once gets explored again instead of being
avoided on stale evidence.
"""

from __future__ import annotations

from msgspec import Struct

from core.clock import Clock


class _Ewma(Struct):
    value: float
    at: float  # clock.now() of the last sample


class LatencyStats:
    """EWMAs of TTFT and TPOT per target label. Implements ``AttemptObserver``: a
    successful attempt's ``ttft_s`` is a TTFT sample (for a non-streamed call, the time to
    the whole answer)."""

    def __init__(self, clock: Clock, alpha: float = 0.2, max_age_s: float | None = None) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        self._clock = clock
        self.alpha = alpha
        self.max_age_s = max_age_s
        self._ttft: dict[str, _Ewma] = {}
        self._tpot: dict[str, _Ewma] = {}

    def _update(self, table: dict[str, _Ewma], label: str, sample: float) -> None:
        now = self._clock.now()
        current = table.get(label)
        if current is None or self._stale(current, now):
            table[label] = _Ewma(sample, now)
            return
        current.value = self.alpha * sample + (1 - self.alpha) * current.value
        current.at = now

    def _stale(self, ewma: _Ewma, now: float) -> bool:
        return self.max_age_s is not None and now - ewma.at > self.max_age_s

    def _read(self, table: dict[str, _Ewma], label: str) -> float | None:
        ewma = table.get(label)
        if ewma is None or self._stale(ewma, self._clock.now()):
            return None
        return ewma.value

    def observe_ttft(self, label: str, seconds: float) -> None:
        """One time-to-first-token sample (negative samples are ignored)."""
        if seconds >= 0:
            self._update(self._ttft, label, seconds)

    def observe_tokens(self, label: str, tokens: int, seconds: float) -> None:
        """``tokens`` output tokens generated in ``seconds`` after the first one; one TPOT
        sample of ``seconds / tokens``. Ignored without tokens or with negative time."""
        if tokens > 0 and seconds >= 0:
            self._update(self._tpot, label, seconds / tokens)

    def estimate(self, label: str) -> tuple[float | None, float | None]:
        """(TTFT seconds, TPOT seconds); None where there is no fresh data."""
        return self._read(self._ttft, label), self._read(self._tpot, label)

    def attempt_started(self, label: str) -> None:
        """Nothing to do before a call."""

    def attempt_finished(
        self, label: str, *, error: str | None, ttft_s: float | None, retryable: bool
    ) -> None:
        """Successful attempts with a time are TTFT samples; failures are not latency."""
        if error is None and ttft_s is not None:
            self.observe_ttft(label, ttft_s)
