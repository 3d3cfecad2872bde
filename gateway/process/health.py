"""One request's view of target health: breaker state, latency estimates, local capacity
and prefix matches, joined from the long-lived trackers into ``core.routing.TargetHealth``."""

from __future__ import annotations

import msgspec

from core.routing import RouteRequest, TargetHealth
from local_tier.capacity import CapacityMonitor
from policies.breaker import SharedBreakers
from policies.latency import LatencyStats
from policies.load import TargetLoad
from policies.load_shared import SharedTargetLoad


class Trackers:
    """The state that outlives config reloads: what the gateway has learnt about targets,
    and how many requests it holds at each (``load``)."""

    def __init__(
        self,
        breakers: SharedBreakers,
        latency: LatencyStats,
        capacity: CapacityMonitor,
        load: TargetLoad | SharedTargetLoad | None = None,
    ) -> None:
        self.breakers = breakers
        self.latency = latency
        self.capacity = capacity
        # Shared across replicas when state is on Redis (``SharedTargetLoad``), else local.
        self.load: TargetLoad | SharedTargetLoad = load if load is not None else TargetLoad()

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
        # EWMAs, the TTFT model and the load factor for what the target holds now.
        latency = trackers.latency.health(label, trackers.load.count(label))
        capacity = trackers.capacity
        if not capacity.knows(label):
            return msgspec.structs.replace(latency, breaker=trackers.breakers.state(label))
        local = capacity.health(label, self._req.prefix_hashes)
        slo = self._req.slo_ttft_ms
        # A replica that cannot start answering within the request's TTFT objective counts
        # as saturated for it: the request moves on to the next target instead of queueing.
        late = slo is not None and not capacity.can_take(label, slo / 1000.0)
        # The latency view (fits, load factor, cut penalty ...) with the replica's own
        # signals laid over it; its metrics TTFT only where the gateway measured none.
        return msgspec.structs.replace(
            latency,
            breaker=trackers.breakers.state(label),
            ttft_s=latency.ttft_s if latency.ttft_s is not None else local.ttft_s,
            saturated=local.saturated or late,
            waiting=local.waiting,
            running=local.running,
            kv_usage=local.kv_usage,
            in_flight=max(local.in_flight, latency.in_flight),
            prefix_blocks=local.prefix_blocks,
            cache_hit_rate=local.cache_hit_rate,
        )


class TrackerObserver:
    """Fans one request's attempt reports out to breakers, latency stats, the gateway's
    per-target load and local capacity.

    An attempt holds its target (in ``Trackers.load``, and for a local replica in the
    capacity monitor) from its start until it fails or, when it succeeded, until
    ``release()`` at the end of the request (a stream keeps the target busy after its
    first chunk); until its first token it is also one of the target's waiting attempts
    (``policies.overdue``). Each TTFT sample goes to the latency stats with the count of
    requests the target held when the attempt started (its load curve's input).

    ``prompt_tokens``: the request's prompt estimate (``RouteRequest.prompt_tokens``), set
    once the request is routed; it goes with each TTFT sample to the latency stats, which
    fit TTFT against prompt length (None: the sample updates only the mean)."""

    def __init__(self, trackers: Trackers) -> None:
        self._trackers = trackers
        self._holding: list[str] = []  # labels this request holds, one entry per attempt
        self._sent_at: dict[str, int] = {}  # label -> load when the last attempt started
        self._tickets: dict[str, int | None] = {}  # label -> the last attempt's waiting ticket
        self._slot_tickets: dict[str, list[int]] = {}  # label -> its attempts' slot tickets
        self.prompt_tokens: int | None = None

    def attempt_started(self, label: str) -> None:
        trackers = self._trackers
        trackers.breakers.attempt_started(label)
        load = self._sent_at[label] = trackers.load.enter(label)
        self._tickets[label] = trackers.latency.attempt_started(
            label, prompt_tokens=self.prompt_tokens, in_flight=load
        )
        self._holding.append(label)
        self._slot_tickets.setdefault(label, []).append(trackers.latency.slots.enter(label))
        if trackers.capacity.knows(label):
            trackers.capacity.sent(label)

    def attempt_finished(
        self, label: str, *, error: str | None, ttft_s: float | None, retryable: bool
    ) -> None:
        trackers = self._trackers
        trackers.breakers.attempt_finished(label, error=error, ttft_s=ttft_s, retryable=retryable)
        trackers.latency.attempt_finished(
            label,
            error=error,
            ttft_s=ttft_s,
            retryable=retryable,
            prompt_tokens=self.prompt_tokens,
            in_flight=self._sent_at.get(label),
            ticket=self._tickets.pop(label, None),
        )
        if label not in self._holding:
            return
        if error is not None:
            self._let_go(label)
            return
        trackers.latency.slots.streaming(self._slot_tickets[label][-1])
        if ttft_s is not None and trackers.capacity.knows(label):
            trackers.capacity.observe_ttft(label, ttft_s)

    def _let_go(self, label: str) -> None:
        self._holding.remove(label)
        self._trackers.load.leave(label)
        self._trackers.latency.slots.leave(self._slot_tickets[label].pop())
        if self._trackers.capacity.knows(label):
            self._trackers.capacity.done(label)

    def release(self) -> None:
        for label in list(self._holding):
            self._let_go(label)
