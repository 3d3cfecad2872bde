"""One request's view of target health: breaker state, latency estimates, local capacity
and prefix matches, joined from the long-lived trackers into ``core.routing.TargetHealth``."""

from __future__ import annotations

import msgspec

from core.routing import RouteRequest, TargetHealth
from local_tier.capacity import CapacityMonitor
from policies.breaker import SharedBreakers
from policies.latency import LatencyStats


class Trackers:
    """The state that outlives config reloads: what the gateway has learnt about targets."""

    def __init__(
        self,
        breakers: SharedBreakers,
        latency: LatencyStats,
        capacity: CapacityMonitor,
    ) -> None:
        self.breakers = breakers
        self.latency = latency
        self.capacity = capacity

    def view(self, req: RouteRequest) -> RequestHealth:
        return RequestHealth(self, req)


class RequestHealth:
    """``HealthView`` for one request (prefix matches depend on the request's prompt)."""

    def __init__(self, trackers: Trackers, req: RouteRequest) -> None:
        self._trackers = trackers
        self._req = req
        self._cache: dict[str, TargetHealth] = {}

    def health(self, label: str) -> TargetHealth:
        known = self._cache.get(label)
        if known is None:
            known = self._cache[label] = self._build(label)
        return known

    def _build(self, label: str) -> TargetHealth:
        trackers = self._trackers
        latency = trackers.latency.health(label)  # EWMAs and the TTFT model
        capacity = trackers.capacity
        if not capacity.knows(label):
            return msgspec.structs.replace(latency, breaker=trackers.breakers.state(label))
        local = capacity.health(label, self._req.prefix_hashes)
        slo = self._req.slo_ttft_ms
        # A replica that cannot start answering within the request's TTFT objective counts
        # as saturated for it: the request moves on to the next target instead of queueing.
        late = slo is not None and not capacity.can_take(label, slo / 1000.0)
        return msgspec.structs.replace(
            local,
            breaker=trackers.breakers.state(label),
            ttft_s=latency.ttft_s if latency.ttft_s is not None else local.ttft_s,
            tpot_s=latency.tpot_s,
            ttft_base_s=latency.ttft_base_s,
            ttft_per_token_s=latency.ttft_per_token_s,
            ttft_spread=latency.ttft_spread,
            saturated=local.saturated or late,
        )


class TrackerObserver:
    """Fans one request's attempt reports out to breakers, latency stats and capacity.

    A local replica counts the request as in flight from the attempt's start until the
    attempt fails or, when it succeeded, until ``release()`` at the end of the request
    (a stream keeps the replica busy after its first chunk).

    ``prompt_tokens``: the request's prompt estimate (``RouteRequest.prompt_tokens``), set
    once the request is routed; it goes with each TTFT sample to the latency stats, which
    fit TTFT against prompt length (None: the sample updates only the mean)."""

    def __init__(self, trackers: Trackers) -> None:
        self._trackers = trackers
        self._holding: list[str] = []
        self.prompt_tokens: int | None = None

    def attempt_started(self, label: str) -> None:
        self._trackers.breakers.attempt_started(label)
        if self._trackers.capacity.knows(label):
            self._trackers.capacity.sent(label)
            self._holding.append(label)

    def attempt_finished(
        self, label: str, *, error: str | None, ttft_s: float | None, retryable: bool
    ) -> None:
        trackers = self._trackers
        trackers.breakers.attempt_finished(label, error=error, ttft_s=ttft_s, retryable=retryable)
        trackers.latency.attempt_finished(
            label, error=error, ttft_s=ttft_s, retryable=retryable, prompt_tokens=self.prompt_tokens
        )
        if label not in self._holding:
            return
        if error is not None:
            self._holding.remove(label)
            trackers.capacity.done(label)
        elif ttft_s is not None:
            trackers.capacity.observe_ttft(label, ttft_s)

    def release(self) -> None:
        for label in self._holding:
            self._trackers.capacity.done(label)
        self._holding.clear()
