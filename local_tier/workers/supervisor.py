"""The supervisor of the ``workers:`` section: owns every worker process of the gateway.

``Supervisor(clock, on_change)``; ``configure(workers)`` with each policy (at start and on
every reload), ``start()`` once in the event loop, ``aclose()`` at shutdown. In between:

- each replica runs as its own task (``local_tier/workers/life.py``): launched in its own
  process group, served once ``/health`` answers 200, restarted with backoff when it exits;
- ``addresses()`` says, per provider, the ``127.0.0.1:PORT`` of the replicas that are ready
  now; ``on_change`` is awaited whenever that set moves (the gateway rebuilds its runtime
  from it, so a crashed replica leaves routing and a restarted one rejoins);
- ``configure`` diffs the new section against the running one (``local_tier/workers/plan.py``):
  new slots start, removed ones drain and stop, changed ones are replaced one replica of an
  entry at a time (``start_first``: the new process is ready before the old one drains;
  ``stop_first``: the other way round); unchanged ones are not touched;
- ``aclose`` drains and stops every replica (the gateway has drained its own requests first).

Not thread-safe: call it from the event loop it was started in.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

import httpx
import structlog

from core.clock import Clock
from core.config_workers import WorkerConfig
from local_tier.workers.backoff import RestartSchedule
from local_tier.workers.launch import LaunchSpec, pick_port
from local_tier.workers.life import Replica, live
from local_tier.workers.lifecycle import ReplicaRecord, State
from local_tier.workers.plan import Plan, SlotKey, plan, slot_specs
from local_tier.workers.process import port_is_free

_log = structlog.get_logger("switchyard")
OnChange = Callable[[], Awaitable[None]]


class Supervisor:
    """Starts, watches, restarts, replaces and stops the worker processes of one gateway.

    ``on_change`` is awaited after the set of ready replicas moved (not while closing);
    ``python`` runs engine jax when an entry names no ``executable``; ``port_free`` says
    whether a port can be bound now; ``environ`` is the base of every worker's environment
    (default: the gateway's)."""

    def __init__(
        self,
        clock: Clock,
        on_change: OnChange | None = None,
        *,
        python: str = sys.executable,
        poll_s: float = 0.2,
        port_free: Callable[[int], bool] = port_is_free,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.clock = clock
        self.poll_s = poll_s
        self.restarts: Counter[SlotKey] = Counter()  # per slot, over generations (metric)
        self._on_change = on_change
        self._python = python
        self._port_free = port_free
        self._environ = environ
        self._client: httpx.AsyncClient | None = None
        self._current: dict[SlotKey, Replica] = {}  # what each slot should run
        self._outgoing: dict[SlotKey, list[Replica]] = {}  # replaced or removed, not yet gone
        self._specs: dict[SlotKey, LaunchSpec] = {}
        self._locks: dict[str, asyncio.Lock] = {}  # one replacement per entry at a time
        self._helpers: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._started = False
        self._closing = False

    # ------------------------------------------------------------------ what life.Host needs
    @property
    def client(self) -> httpx.AsyncClient:
        """For ``/health`` and ``/metrics`` on loopback (never through a proxy)."""
        if self._client is None:
            self._client = httpx.AsyncClient(trust_env=False, timeout=2.0)
        return self._client

    def environment(self) -> dict[str, str]:
        return dict(os.environ if self._environ is None else self._environ)

    def pick_port(self, replica: Replica) -> int | None:
        """A port of the replica's range that no other live replica holds, its previous
        one first (a restarted replica keeps its label when it can)."""
        taken = {
            r.record.port
            for r in self.replicas()
            if r is not replica and r.record.port is not None
            if r.record.state is not State.STOPPED
        }
        ports = list(replica.config.ports)
        previous = replica.record.port
        if previous in ports:
            ports.insert(0, ports.pop(ports.index(previous)))
        return pick_port(ports, taken, self._port_free)

    def changed(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    async def routing_changed(self) -> None:
        if self._on_change is None or self._closing:
            return
        try:
            await self._on_change()
        except Exception:  # the gateway logs its own failures; a replica's life goes on
            _log.exception("workers.routing_update_failed")

    def restarted(self, key: SlotKey) -> None:
        self.restarts[key] += 1

    # ------------------------------------------------------------------ the section
    def configure(self, workers: Mapping[str, WorkerConfig], base_dir: Path | None = None) -> Plan:
        """Follow ``workers`` from now on (see the module's docstring); the plan applied.
        ``base_dir``: where relative ``log_dir`` paths start (the policy file's folder)."""
        specs = slot_specs(workers, python=self._python, base_dir=base_dir)
        moves = plan(self._specs, specs)
        self._specs = specs
        for key in moves.keep:
            self._current[key].config = workers[key[0]]
            backoff = workers[key[0]].backoff
            self._current[key].schedule.configure(backoff.initial_s, backoff.max_s)
        for key in moves.stop:
            self._remove(key)
        for key in moves.replace:
            self._replace(key, specs[key], workers[key[0]])
        for key in moves.start:
            self._current[key] = self._replica(key, specs[key], workers[key[0]], 0)
            if self._started:
                self._run(self._current[key])
        if not moves.unchanged:
            _log.info(
                "workers.planned",
                start=_names(moves.start),
                replace=_names(moves.replace),
                stop=_names(moves.stop),
                keep=_names(moves.keep),
            )
        self.changed()
        return moves

    def _replica(self, key: SlotKey, spec: LaunchSpec, config: WorkerConfig, gen: int) -> Replica:
        backoff = config.backoff
        schedule = RestartSchedule(backoff.initial_s, backoff.max_s, self.clock)
        return Replica(key, spec, config, gen, ReplicaRecord(self.clock), schedule)

    def _remove(self, key: SlotKey) -> None:
        replica = self._current.pop(key)
        if self._started:
            self._outgoing.setdefault(key, []).append(replica)
            self._helper(self._retire_outgoing(key))

    def _replace(self, key: SlotKey, spec: LaunchSpec, config: WorkerConfig) -> None:
        old = self._current[key]
        new = self._current[key] = self._replica(key, spec, config, old.generation + 1)
        if self._started:
            self._outgoing.setdefault(key, []).append(old)
            self._helper(self._roll(key, new))

    async def _roll(self, key: SlotKey, new: Replica) -> None:
        """Replace the outgoing replicas of ``key`` by ``new``, in ``new``'s order. Holds
        the entry's lock until ``new`` is ready: a replacement that never gets ready stalls
        the entry's roll-out (the old replicas keep serving) until a reload supersedes it."""
        async with self._locks.setdefault(key[0], asyncio.Lock()):
            if self._current.get(key) is not new:
                return  # superseded (a later reload): its own roll retires the outgoing
            if new.config.replace_order == "stop_first":
                await self._retire_outgoing(key)
            self._run(new)
            await self._until(lambda: new.record.serving or self._current.get(key) is not new)
            if self._current.get(key) is new:
                await self._retire_outgoing(key)

    async def _retire_outgoing(self, key: SlotKey) -> None:
        await asyncio.gather(*(self._retire(r) for r in list(self._outgoing.get(key, ()))))

    async def _retire(self, replica: Replica) -> None:
        """Drain and stop ``replica`` (idempotent); then it is forgotten."""
        replica.stop_requested.set()
        if replica.task is None:  # never launched
            if replica.record.state is not State.STOPPED:
                replica.record.move(State.DRAINING)
                replica.record.stopped()
        else:
            await asyncio.wait({replica.task})  # not cancelled if this caller is
        left = [r for r in self._outgoing.get(replica.key, ()) if r is not replica]
        if left:
            self._outgoing[replica.key] = left
        else:
            self._outgoing.pop(replica.key, None)
        self.changed()

    # ------------------------------------------------------------------ running
    async def start(self) -> None:
        """Launch every configured replica (at once; they become ready on their own)."""
        if self._started:
            return
        self._started = True
        for replica in self._current.values():
            self._run(replica)

    def _run(self, replica: Replica) -> None:
        name = f"worker-{replica.name}-{replica.index}-{replica.generation}"
        replica.task = asyncio.create_task(live(replica, self), name=name)
        replica.task.add_done_callback(_log_failure)

    def _helper(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._helpers.add(task)
        task.add_done_callback(self._helpers.discard)
        task.add_done_callback(_log_failure)

    async def _until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._wake.wait()

    async def aclose(self) -> None:
        """Drain and stop every replica, all at once, each within its own timeouts."""
        self._closing = True
        helpers = list(self._helpers)
        for task in helpers:
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        await asyncio.gather(*(self._retire(r) for r in self.replicas()))
        self._current.clear()
        self._outgoing.clear()
        if self._client is not None:
            await self._client.aclose()

    # ------------------------------------------------------------------ views
    def replicas(self) -> list[Replica]:
        """Every replica it manages, being replaced or removed ones too, in slot order."""
        outgoing = [r for replicas in self._outgoing.values() for r in replicas]
        everyone = [*self._current.values(), *outgoing]
        return sorted(everyone, key=lambda r: (r.key, r.generation))

    def addresses(self) -> dict[str, tuple[str, ...]]:
        """Per provider, the addresses of its replicas that are ready now."""
        ready: dict[str, list[str]] = {}
        for replica in self.replicas():
            if replica.record.serving and replica.address is not None:
                ready.setdefault(replica.spec.provider, []).append(replica.address)
        return {provider: tuple(addresses) for provider, addresses in ready.items()}

    def status(self) -> list[dict[str, Any]]:
        """One row per replica process (being replaced or removed ones too)."""
        rows = []
        for replica in self.replicas():
            record = replica.record
            retry = (
                None if record.retry_at is None else max(0.0, record.retry_at - self.clock.now())
            )
            rows.append(
                {
                    "name": replica.name,
                    "replica": replica.index,
                    "generation": replica.generation,
                    "provider": replica.spec.provider,
                    "engine": replica.spec.engine,
                    "state": record.state.value,
                    "pid": record.pid,
                    "port": record.port,
                    "address": replica.address,
                    "devices": list(replica.spec.devices),
                    "restarts": record.restarts,
                    "last_exit_code": record.exit_code,
                    "state_for_s": round(record.age(), 3),
                    "retry_in_s": retry,
                    "outgoing": self._current.get(replica.key) is not replica,
                }
            )
        return rows


def _names(keys: list[SlotKey]) -> list[str]:
    return [f"{name}/{index}" for name, index in keys]


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        _log.error("workers.task_failed", task=task.get_name(), error=repr(task.exception()))
