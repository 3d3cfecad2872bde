"""Circuit breakers shared by every gateway replica through the ``Store``.

Reads never wait for the store: ``state(label)`` answers from a local snapshot that a
background task refreshes every ``refresh_s`` (one READ script for all known targets, one
round trip) and that every outcome this process records updates at once. Writes are
fire-and-forget: one writer task per target sends the outcomes in order, batched (one
RECORD script per batch); its answer replaces the snapshot, so a
breaker opened by failures seen on several replicas is seen by all of them within one
refresh. Only half-open probes wait for the store (``try_probe``: one PROBE script), because
"at most N probes" must hold across replicas.

When the store is unreachable every operation falls back to the local state machine (this
process's own observations) and the failure is logged once per outage; when it is back,
the next refresh replaces the local state with the shared one (observations made while it
was down stay local).

Time is the clock's wall time: the timestamps in the shared hash must mean the same thing
in every process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterable
from typing import Protocol

import structlog

from core.clock import Clock
from core.config_routing import BreakerConfig
from core.routing import BreakerState
from policies.breaker.machine import BreakerMachine, Outcome, classify
from policies.breaker.scripts import (
    PROBE,
    READ,
    RECORD,
    config_args,
    parse_fields,
    record_args,
)
from policies.store.base import Store, StoreUnavailableError

KEY_PREFIX = "breaker:"
_log = structlog.get_logger("switchyard")


class Labelled(Protocol):
    """Anything with a target label (``routers.targets.Target``; policies do not import
    routers)."""

    @property
    def label(self) -> str: ...


class SharedBreakers:
    """Per-target breakers in ``store``. Implements ``core.routing.AttemptObserver``;
    ``gate`` is the executor's gate. Call ``start()`` to run the background refresh and
    ``aclose()`` to stop it and wait for pending writes."""

    def __init__(
        self, config: BreakerConfig, store: Store, clock: Clock, refresh_s: float = 0.2
    ) -> None:
        self.config = config
        self._store = store
        self._clock = clock
        self._refresh_s = refresh_s
        # Idle keys expire; an expired key reads as a fresh closed breaker.
        self._ttl_s = config.window_s + config.cooldown_s + 3600.0
        self._machines: dict[str, BreakerMachine] = {}
        self._queued: dict[str, list[Outcome]] = {}  # label -> outcomes not yet written
        self._writers: dict[str, asyncio.Task[None]] = {}  # label -> its writer task
        self._tasks: set[asyncio.Task[None]] = set()
        self._refresher: asyncio.Task[None] | None = None
        self.store_down = False
        self.store_failures = 0
        # (label, new state) -> how often this replica saw the breaker change to it (its
        # own outcomes and other replicas' through the refresh), for the metrics
        self.transitions: Counter[tuple[str, BreakerState]] = Counter()

    @staticmethod
    def key(label: str) -> str:
        return KEY_PREFIX + label

    def _machine(self, label: str) -> BreakerMachine:
        machine = self._machines.get(label)
        if machine is None:
            machine = self._machines[label] = BreakerMachine(self.config)
        return machine

    def track(self, labels: Iterable[str]) -> None:
        """Refresh exactly these targets from now on (the gateway passes every label of each
        new runtime, so the first request already sees breakers other replicas opened, and a
        replica that discovery removed is no longer read). A label dropped here comes back
        with its next attempt (one still running on a retired runtime)."""
        wanted = set(labels)
        for label in list(self._machines):
            if label not in wanted:
                del self._machines[label]
        for label in wanted:
            self._machine(label)

    def state(self, label: str) -> BreakerState:
        """The breaker's state from the local snapshot (no I/O)."""
        return self._machine(label).state(self._clock.wall())

    async def try_probe(self, label: str) -> bool:
        """May a call go to ``label`` now? Closed: True; open: False; half-open: True when
        a probe slot was taken atomically in the store (so the limit holds across replicas),
        or in the local machine when the store is unreachable."""
        machine = self._machine(label)
        now = self._clock.wall()
        state = machine.state(now)
        if state != "half_open":
            return state == "closed"
        try:
            answer = await self._store.run(
                PROBE, [self.key(label)], [now, *config_args(self.config, self._ttl_s)]
            )
        except StoreUnavailableError as exc:
            self._down(exc)
            return machine.try_probe(now)
        self._up()
        machine.fields = parse_fields(answer[1:])
        return int(answer[0]) == 1

    async def gate(self, target: Labelled) -> bool | str:
        """The executor's gate (``routers.executor.Gate``): ``admit(target.label)``."""
        return await self.admit(target.label)

    async def admit(self, label: str) -> bool | str:
        """True to call the target now, else the reason to skip it ("circuit open", or
        "probe limit" when half-open and every probe slot is taken)."""
        state = self.state(label)
        if state == "open":
            return "circuit open"
        if state == "half_open" and not await self.try_probe(label):
            return "probe limit"
        return True

    def attempt_started(self, label: str) -> None:
        """Nothing to do before a call (probe slots are taken by ``try_probe``)."""

    def attempt_finished(
        self, label: str, *, error: str | None, ttft_s: float | None, retryable: bool
    ) -> None:
        """Record the outcome locally now and in the store in the background."""
        outcome = classify(error)
        machine, now = self._machine(label), self._clock.wall()
        before = machine.state(now)
        after = machine.record(now, outcome)
        if after != before:
            self.transitions[(label, after)] += 1
        self._queued.setdefault(label, []).append(outcome)
        if label not in self._writers:
            self._spawn_writer(label)

    def record(self, label: str, error: str | None) -> None:
        """``attempt_finished`` without the timing fields (for callers outside the executor)."""
        self.attempt_finished(label, error=error, ttft_s=None, retryable=False)

    def _spawn_writer(self, label: str) -> None:
        try:
            task = asyncio.get_running_loop().create_task(self._write(label))
        except RuntimeError:  # no event loop (a synchronous caller): local state only
            self._queued.pop(label, None)
            return
        self._writers[label] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, label: str) -> None:
        """One writer per label: outcomes go to the store in the order they happened, in
        batches (everything queued while the previous RECORD was in flight), so answers
        never arrive out of order and a busy target costs one write in flight, not one
        per request."""
        try:
            while outcomes := self._queued.pop(label, None):
                await self._push(label, outcomes)
        finally:
            self._writers.pop(label, None)

    async def _push(self, label: str, outcomes: list[Outcome]) -> None:
        args = record_args(self._clock.wall(), outcomes, self.config, self._ttl_s)
        try:
            answer = await self._store.run(RECORD, [self.key(label)], args)
        except StoreUnavailableError as exc:
            self._down(exc)
            return
        self._up()
        if not self._queued.get(label):  # newer outcomes pending: keep the local view
            self._machine(label).fields = parse_fields(answer)

    async def refresh(self) -> None:
        """Replace the snapshot of every known target with the store's state (one round
        trip). Targets with a write in flight keep their local state until it lands."""
        labels = list(self._machines)
        if not labels:
            return
        try:
            answer = await self._store.run(READ, [self.key(label) for label in labels], [])
        except StoreUnavailableError as exc:
            self._down(exc)
            return
        self._up()
        now = self._clock.wall()
        for label, flat in zip(labels, answer, strict=True):
            if label not in self._writers:
                machine = self._machine(label)
                before = machine.state(now)
                machine.fields = parse_fields(flat)
                if (after := machine.state(now)) != before:
                    self.transitions[(label, after)] += 1

    async def flush(self) -> None:
        """Wait for every background write started so far (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                await self.refresh()
            except Exception:  # a bug must not stop the refresh loop for good
                _log.exception("breaker.refresh_failed")

    async def start(self) -> None:
        """Start the background refresh (idempotent)."""
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_forever())

    async def aclose(self) -> None:
        """Stop the refresh and wait for pending writes."""
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
            self._refresher = None
        await self.flush()

    def _down(self, exc: StoreUnavailableError) -> None:
        self.store_failures += 1
        if not self.store_down:
            self.store_down = True
            _log.warning("breaker.store_unavailable", error=str(exc), fallback="local")

    def _up(self) -> None:
        if self.store_down:
            self.store_down = False
            _log.info("breaker.store_recovered")
