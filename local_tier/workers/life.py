"""The life of one worker replica, as one asyncio task (``live``): launch, wait for health,
serve, and on an exit clean up its process group, wait out the backoff and launch again;
until it is asked to stop (``Replica.stop_requested``), then drain and stop.

Drain: the replica leaves the routing table first (``Host.routing_changed`` returns once
the gateway's runtime no longer lists it), then its ``/metrics`` is polled until nothing
runs or waits there (or ``drain_timeout_s``, or its process is gone), then its group gets
SIGTERM, and SIGKILL after ``stop_timeout_s``.

Log events (structlog, ``switchyard``): ``worker.starting``, ``worker.ready``,
``worker.crashed`` (warning: exit code, reason ``exited`` / ``start_timeout`` /
``unhealthy`` (ready, then ``/health`` failed ``unhealthy_after`` times in a row) /
``launch_failed``), ``worker.restarting`` (the backoff), ``worker.draining``,
``worker.drain_timeout`` (warning), ``worker.stopped``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import httpx
import structlog

from core.clock import Clock
from core.config_workers import WorkerConfig
from local_tier.workers.backoff import RestartSchedule
from local_tier.workers.launch import LaunchSpec
from local_tier.workers.lifecycle import ReplicaRecord, State
from local_tier.workers.plan import SlotKey
from local_tier.workers.process import ManagedProcess, healthy, idle
from local_tier.workers.replicas import worker_address

_log = structlog.get_logger("switchyard")
Outcome = Literal["healthy", "exited", "start_timeout", "unhealthy", "stopping"]


class Host(Protocol):
    """What a replica needs from its supervisor."""

    clock: Clock
    poll_s: float

    @property
    def client(self) -> httpx.AsyncClient: ...

    def pick_port(self, replica: Replica) -> int | None: ...

    def environment(self) -> dict[str, str]: ...

    def changed(self) -> None:
        """A replica's state moved (wakes whoever waits on one)."""

    async def routing_changed(self) -> None:
        """The set of serving replicas changed: returns once routing follows it."""

    def restarted(self, key: SlotKey) -> None:
        """Count one restart (the metric)."""


@dataclass(eq=False)
class Replica:
    """One slot's process over its lifetime, restarts included (a replacement is a new
    ``Replica`` with the next ``generation``)."""

    key: SlotKey
    spec: LaunchSpec
    config: WorkerConfig  # timeouts and backoff are read from here at each use
    generation: int
    record: ReplicaRecord
    schedule: RestartSchedule
    process: ManagedProcess | None = None
    task: asyncio.Task[None] | None = None
    stop_requested: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def name(self) -> str:
        return self.key[0]

    @property
    def index(self) -> int:
        return self.key[1]

    @property
    def address(self) -> str | None:
        port = self.record.port
        return None if port is None else worker_address(port)

    def fields(self) -> dict[str, object]:
        """Its identity, for log lines."""
        return {"worker": self.name, "replica": self.index, "generation": self.generation}


async def live(replica: Replica, host: Host) -> None:
    """Run ``replica`` until it is asked to stop and has stopped."""
    restart = False
    try:
        while not replica.stop_requested.is_set():
            outcome: Outcome = "exited"
            if _launch(replica, host, restart=restart):
                outcome = await _until_healthy(replica, host)
                if outcome == "healthy":
                    await _serve(replica, host)
                    outcome = await _until_exit_or_sick(replica, host)
            if outcome == "stopping":
                break
            await _failed(replica, host, outcome if replica.process else "launch_failed")
            restart = True
    finally:
        await _drain_and_stop(replica, host)


def _launch(replica: Replica, host: Host, *, restart: bool) -> bool:
    """Start a process on a free port of the range; False (a failure) when none is free
    or the program cannot be run."""
    port = host.pick_port(replica)
    replica.process = None
    if port is None:
        _log.error("worker.no_free_port", **replica.fields(), port_range=replica.config.port_range)
        return False
    spec = replica.spec
    log_path = Path(spec.log_path) if spec.log_path else None
    process = ManagedProcess(
        spec.argv_for(port),
        port=port,
        env=spec.env_for(port, host.environment()),
        log_path=log_path,
    )
    try:
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
        process.start()
    except OSError as exc:
        _log.error("worker.launch_failed", **replica.fields(), error=str(exc))
        return False
    replica.process = process
    replica.record.launched(process.pid or 0, port, restart=restart)
    if restart:
        host.restarted(replica.key)
    _log.info(
        "worker.starting",
        **replica.fields(),
        pid=process.pid,
        port=port,
        devices=",".join(spec.devices) or None,
        restart=restart,
    )
    host.changed()
    return True


async def _stop_wait(replica: Replica, seconds: float) -> bool:
    """Sleep up to ``seconds``; True at once when the replica is asked to stop."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.0, seconds)):
            await replica.stop_requested.wait()
    return replica.stop_requested.is_set()


async def _until_healthy(replica: Replica, host: Host) -> Outcome:
    process = replica.process
    assert process is not None
    deadline = host.clock.now() + replica.config.start_timeout_s
    while host.clock.now() < deadline:
        if replica.stop_requested.is_set():
            return "stopping"
        if process.exit_code() is not None:
            return "exited"
        if await healthy(host.client, process.base_url):
            return "healthy"
        await _stop_wait(replica, host.poll_s)
    return "start_timeout"


async def _serve(replica: Replica, host: Host) -> None:
    record = replica.record
    started = record.age()
    record.move(State.READY)
    replica.schedule.ready()
    _log.info(
        "worker.ready", **replica.fields(), pid=record.pid, port=record.port, startup_s=started
    )
    host.changed()
    await host.routing_changed()


async def _until_exit_or_sick(replica: Replica, host: Host) -> Outcome:
    """Watch a ready process: "exited", "stopping", or "unhealthy" once its ``/health``
    failed ``unhealthy_after`` checks in a row (one every ``health_interval_s``)."""
    process = replica.process
    assert process is not None
    config, failures = replica.config, 0
    next_check = host.clock.now() + config.health_interval_s
    while process.exit_code() is None:
        if await _stop_wait(replica, host.poll_s):
            return "stopping"
        if host.clock.now() < next_check:
            continue
        ok = await healthy(host.client, process.base_url, timeout_s=config.health_interval_s)
        failures = 0 if ok else failures + 1
        if failures >= config.unhealthy_after and process.exit_code() is None:
            return "unhealthy"
        next_check = host.clock.now() + config.health_interval_s
    return "exited"


async def _failed(replica: Replica, host: Host, reason: str) -> None:
    """It exited or never became healthy: clean up its group, leave routing, back off."""
    record = replica.record
    was_serving = record.serving
    process = replica.process
    if process is not None:  # what is left of its group (a hung start, orphaned engines)
        await asyncio.to_thread(process.stop, replica.config.stop_timeout_s)
    exit_code = process.exit_code() if process is not None else None
    record.crashed(exit_code)
    _log.warning(
        "worker.crashed",
        **replica.fields(),
        reason=reason,
        exit_code=exit_code,
        pid=record.pid,
        restarts=record.restarts,
    )
    host.changed()
    if was_serving:
        await host.routing_changed()
    delay = replica.schedule.failed()
    record.backing_off(delay)
    _log.info(
        "worker.restarting", **replica.fields(), delay_s=delay, streak=replica.schedule.streak
    )
    host.changed()
    await _stop_wait(replica, delay)


async def _drain_and_stop(replica: Replica, host: Host) -> None:
    record = replica.record
    was_serving = record.serving
    if record.state is not State.DRAINING:
        record.move(State.DRAINING)
    host.changed()
    process = replica.process
    if process is not None and process.exit_code() is None:
        _log.info("worker.draining", **replica.fields(), pid=record.pid, serving=was_serving)
        if was_serving:
            await host.routing_changed()  # stop sending first
            if not await _drained(replica, host, process):
                _log.warning("worker.drain_timeout", **replica.fields(), pid=record.pid)
    if process is not None:
        await asyncio.to_thread(process.stop, replica.config.stop_timeout_s)
        record.exit_code = process.exit_code()
    record.stopped()
    _log.info("worker.stopped", **replica.fields(), exit_code=record.exit_code)
    host.changed()


async def _drained(replica: Replica, host: Host, process: ManagedProcess) -> bool:
    """Wait until its ``/metrics`` shows nothing running or waiting (or it exited)."""
    deadline = host.clock.now() + replica.config.drain_timeout_s
    while host.clock.now() < deadline:
        if process.exit_code() is not None or await idle(host.client, process.base_url):
            return True
        await asyncio.sleep(host.poll_s)
    return False
