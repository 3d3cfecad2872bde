"""The gateway's side of the ``workers:`` section (local_tier/workers/ owns the processes):
ready workers become replicas of their provider in the runtime, the way DNS discovery's
addresses do (``GatewayState.apply_workers``); ``GET /admin/targets`` and ``switchyard
workers status`` show each process with its load; Prometheus gets restarts and states."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from core.config import Config
from core.config_workers import managed_providers
from gateway.process.runtime import Runtime
from local_tier.capacity import CapacityMonitor
from local_tier.workers import Supervisor
from local_tier.workers.lifecycle import State
from local_tier.workers.replicas import managed_key


def worker_replicas(supervisor: Supervisor, config: Config) -> dict[str, tuple[str, ...]]:
    """The runtime ``replicas`` entries of ``config``'s worker-served providers: the
    addresses of their ready workers (maybe none)."""
    ready = supervisor.addresses()
    served = managed_providers(config.workers) & set(config.providers)
    return {managed_key(provider): ready.get(provider, ()) for provider in sorted(served)}


def config_dir(config: Config) -> Path | None:
    """Where relative ``log_dir`` paths start: the policy file's folder."""
    return Path(config.source).parent if config.source else None


def workers_report(
    supervisor: Supervisor, runtime: Runtime, capacity: CapacityMonitor
) -> list[dict[str, Any]]:
    """Each worker process with its state and, while it is routed, the load its
    ``/metrics`` shows (waiting = its queue, running, KV cache use 0-1, from the capacity
    monitor); ``targets``: its target labels."""
    labels: dict[tuple[str, str], list[str]] = {}
    for targets in runtime.targets.values():
        for target in targets:
            if target.replica is not None:
                where = labels.setdefault((target.provider_name, target.replica), [])
                if target.label not in where:
                    where.append(target.label)
    rows = []
    for row in supervisor.status():
        mine = labels.get((row["provider"], row["address"]), [])
        watched = [label for label in mine if capacity.knows(label)]
        health = capacity.signals(watched[0]) if watched else None
        if health is not None and health.read_at is None:
            health = None  # not polled yet: unknown, not idle
        rows.append(
            {
                **row,
                "targets": mine,
                "waiting": health.waiting if health else None,
                "running": health.running if health else None,
                "kv_usage": health.kv_usage if health else None,
            }
        )
    return rows


def worker_metrics(supervisor: Supervisor) -> Iterator[Metric]:
    """``switchyard_worker_restarts_total`` and ``switchyard_worker_state`` per worker
    entry and replica index (nothing when no worker was ever configured)."""
    rows = [row for row in supervisor.status() if not row["outgoing"]]
    if not rows and not supervisor.restarts:
        return
    restarts = CounterMetricFamily(
        "switchyard_worker_restarts",
        "Worker processes started again after they exited or failed to start.",
        labels=["worker", "replica"],
    )
    slots = {(row["name"], row["replica"]) for row in rows} | set(supervisor.restarts)
    for name, index in sorted(slots):
        restarts.add_metric([name, str(index)], float(supervisor.restarts[(name, index)]))
    yield restarts
    states = GaugeMetricFamily(
        "switchyard_worker_state",
        "Each worker replica's state: 1 for the state it is in, 0 for the others.",
        labels=["worker", "replica", "state"],
    )
    for row in rows:
        for state in State:
            value = 1.0 if row["state"] == state.value else 0.0
            states.add_metric([row["name"], str(row["replica"]), state.value], value)
    yield states
