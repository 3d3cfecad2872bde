"""Series that describe the process rather than a request, read when Prometheus scrapes:
requests in flight, breakers, the admission queue, the gateway's load per target, local
replicas' saturation, the ledger's backlog and config reloads."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.process.reload import Reloader
from gateway.process.state import GatewayState, target_labels
from gateway.process.workers import worker_metrics
from policies.idempotency import IdempotencyKeys

_BREAKER_STATES = ("closed", "open", "half_open")


class StateCollector(Collector):
    """Reads ``state`` (and the ``reloader``, when the config came from a file) at scrape
    time; nothing is counted twice and nothing runs on the request path."""

    def __init__(
        self,
        state: GatewayState,
        reloader: Reloader | None,
        idempotency: Callable[[], IdempotencyKeys | None] = lambda: None,
    ) -> None:
        self._state = state
        self._reloader = reloader
        self._idempotency = idempotency  # made on first keyed request (gateway/http)

    def collect(self) -> Iterator[Metric]:
        yield from self._requests()
        yield from self._breakers()
        yield from self._targets()
        yield from self._replicas()
        yield from worker_metrics(self._state.workers)  # restarts, states (workers:)
        yield from self._ledger()
        yield from self._reloads()
        yield from self._idempotent()

    def _requests(self) -> Iterator[Metric]:
        state = self._state
        yield _gauge(
            "switchyard_requests_in_flight", "Requests in progress.", state.in_flight.requests
        )
        yield _gauge(
            "switchyard_queue_depth",
            "Requests waiting in the admission queue for a local replica.",
            state.queue.depth,
        )

    def _breakers(self) -> Iterator[Metric]:
        breakers = self._state.trackers.breakers
        labels = target_labels(self._state.runtime)
        current = GaugeMetricFamily(
            "switchyard_breaker_state",
            "Circuit breaker state per target: 1 for the state it is in, 0 for the others.",
            labels=["target", "state"],
        )
        for label in labels:
            now = breakers.state(label)
            for name in _BREAKER_STATES:
                current.add_metric([label, name], 1.0 if name == now else 0.0)
        yield current
        moves = CounterMetricFamily(
            "switchyard_breaker_transitions",
            "Breaker state changes this replica saw, by target and the state entered.",
            labels=["target", "to"],
        )
        for (label, to), count in sorted(breakers.transitions.items()):
            moves.add_metric([label, to], float(count))
        yield moves

    def _targets(self) -> Iterator[Metric]:
        load = self._state.trackers.load
        gauge = GaugeMetricFamily(
            "switchyard_target_in_flight",
            "Calls the gateway has open at each target (all replicas when state is shared).",
            labels=["target"],
        )
        for label in target_labels(self._state.runtime):
            gauge.add_metric([label], float(load.count(label)))
        yield gauge

    def _replicas(self) -> Iterator[Metric]:
        capacity = self._state.trackers.capacity
        families = {
            name: GaugeMetricFamily(name, doc, labels=["target"])
            for name, doc in (
                ("switchyard_replica_saturated", "1 while a local replica is saturated."),
                ("switchyard_replica_requests_waiting", "Requests queued on the replica."),
                ("switchyard_replica_requests_running", "Requests in the replica's batch."),
                ("switchyard_replica_kv_cache_usage_ratio", "The replica's KV cache use, 0-1."),
            )
        }
        for label in capacity.labels():
            signals = capacity.signals(label)
            values = (capacity.saturated(label), signals.waiting, signals.running)
            for family, value in zip(families.values(), (*values, signals.kv_usage), strict=True):
                family.add_metric([label], float(value))
        yield from families.values()

    def _ledger(self) -> Iterator[Metric]:
        state = self._state
        yield _gauge(
            "switchyard_ledger_pending_commits",
            "Finished requests whose settle and ledger row are still being written.",
            len(state.in_flight.commits),
        )
        spooled = getattr(state.ledger, "spooled", None)
        replayed = getattr(state.ledger, "replayed", None)
        if spooled is not None and replayed is not None:
            yield _counter(
                "switchyard_ledger_spooled_rows",
                "Rows written to the local spool while the primary ledger was unreachable.",
                spooled,
            )
            yield _counter(
                "switchyard_ledger_replayed_rows",
                "Spooled rows moved into the primary ledger.",
                replayed,
            )

    def _reloads(self) -> Iterator[Metric]:
        reloader = self._reloader
        if reloader is None:
            return
        outcomes = CounterMetricFamily(
            "switchyard_config_reloads",
            "Policy reloads by outcome: applied, rejected (invalid file), failed (start).",
            labels=["outcome"],
        )
        for outcome in ("applied", "rejected", "failed"):
            outcomes.add_metric([outcome], float(reloader.outcomes[outcome]))
        yield outcomes
        if reloader.last_applied_at is not None:
            yield _gauge(
                "switchyard_config_last_reload_success_timestamp_seconds",
                "When the last reload was applied (Unix seconds).",
                reloader.last_applied_at,
            )

    def _idempotent(self) -> Iterator[Metric]:
        keys = self._idempotency()
        outcomes = CounterMetricFamily(
            "switchyard_idempotency_keys",
            "Requests with an Idempotency-Key by what the key held: claimed (it ran), "
            "replayed (a stored answer), mismatch (another body: 422).",
            labels=["outcome"],
        )
        for outcome in ("claimed", "replayed", "mismatch"):
            outcomes.add_metric([outcome], float(keys.outcomes[outcome] if keys else 0))
        yield outcomes


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=float(value))
