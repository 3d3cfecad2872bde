"""The worker supervisor with real processes (tests/fixtures/fake_worker.py, engine
``command``): start and serve, restart after a crash with backoff, replace a changed entry
(start_first and stop_first) while an answer in flight on the old process finishes, stop a
removed one, give up on a start that never gets healthy, and leave no process behind."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import msgspec
import pytest
from structlog.testing import capture_logs

from core.clock import SystemClock
from core.config_workers import WorkerConfig
from local_tier.workers import Supervisor
from tests.integration.workers_helpers import fake_worker, free_range, group_gone

pytestmark = pytest.mark.anyio


def entry(name: str, *extra: str, **fields: Any) -> WorkerConfig:
    first, last = free_range(4)
    raw = {
        "engine": "command",
        "provider": "pool",
        "command": fake_worker(name, *extra),
        "port_range": [first, last],
        "start_timeout_s": 30,
        "backoff": {"initial_s": 0.2, "max_s": 1.0},
        "drain_timeout_s": 10,
        "stop_timeout_s": 5,
        **fields,
    }
    return msgspec.convert(raw, WorkerConfig)


class Routing:
    """Stands in for the gateway: records the ready set each time it is told it moved."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, ...]] = []
        self.supervisor: Supervisor | None = None

    async def __call__(self) -> None:
        assert self.supervisor is not None
        self.seen.append(self.supervisor.addresses().get("pool", ()))


@pytest.fixture
async def supervised() -> AsyncIterator[tuple[Supervisor, Routing]]:
    routing = Routing()
    supervisor = Supervisor(SystemClock(), routing, poll_s=0.05)
    routing.supervisor = supervisor
    try:
        yield supervisor, routing
    finally:
        pids = [r.record.pid for r in supervisor.replicas() if r.record.pid]
        await supervisor.aclose()
        assert all(group_gone(pid) for pid in pids)


async def until(condition: Callable[[], bool], limit_s: float = 30.0) -> None:
    async with asyncio.timeout(limit_s):
        while not condition():
            await asyncio.sleep(0.02)


def rows(supervisor: Supervisor) -> dict[str, dict[str, Any]]:
    """The current replica of each entry (replica index 0), by entry name."""
    return {row["name"]: row for row in supervisor.status() if not row["outgoing"]}


def ready(supervisor: Supervisor, *names: str) -> Callable[[], bool]:
    return lambda: all(rows(supervisor).get(n, {}).get("state") == "ready" for n in names)


async def ask(address: str, prompt: str = "hi", stream: bool = False) -> str:
    body = {"model": "fake", "stream": stream, "messages": [{"role": "user", "content": prompt}]}
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        response = await client.post(f"http://{address}/v1/chat/completions", json=body)
    assert response.status_code == 200
    return response.text


async def test_workers_start_in_their_own_groups_serve_and_stop(
    supervised: tuple[Supervisor, Routing],
) -> None:
    supervisor, routing = supervised
    supervisor.configure({"a": entry("a"), "b": entry("b")})
    await supervisor.start()
    await until(ready(supervisor, "a", "b"))
    status = rows(supervisor)
    for name in ("a", "b"):
        pid = status[name]["pid"]
        assert os.getpgid(pid) == pid  # the leader of a group of its own
        assert f"worker={name} pid={pid}" in await ask(status[name]["address"])
    assert routing.seen[-1] == (status["a"]["address"], status["b"]["address"])  # slot order
    pids = [status[n]["pid"] for n in ("a", "b")]
    await supervisor.aclose()
    assert all(group_gone(pid) for pid in pids)
    assert supervisor.status() == []


async def test_a_killed_worker_leaves_routing_and_comes_back_after_its_backoff(
    supervised: tuple[Supervisor, Routing],
) -> None:
    supervisor, routing = supervised
    supervisor.configure({"a": entry("a")})
    await supervisor.start()
    await until(ready(supervisor, "a"))
    before = rows(supervisor)["a"]
    with capture_logs() as logs:
        os.kill(before["pid"], signal.SIGKILL)
        await until(lambda: rows(supervisor)["a"]["restarts"] == 1)
        await until(ready(supervisor, "a"))
    after = rows(supervisor)["a"]
    assert after["pid"] != before["pid"]
    assert after["last_exit_code"] == -signal.SIGKILL
    assert after["port"] == before["port"]  # its old port was free again: same label
    assert () in routing.seen  # it left routing while it was down
    assert routing.seen[-1] == (after["address"],)
    assert supervisor.restarts[("a", 0)] == 1
    crashed = [e for e in logs if e["event"] == "worker.crashed"]
    assert crashed[0]["exit_code"] == -signal.SIGKILL
    assert crashed[0]["reason"] == "exited"
    assert [e["delay_s"] for e in logs if e["event"] == "worker.restarting"] == [0.2]
    assert f"pid={after['pid']}" in await ask(after["address"])


async def test_a_worker_whose_health_fails_is_stopped_and_restarted(
    supervised: tuple[Supervisor, Routing],
) -> None:
    """A ready process that stops answering /health 200 (a hung engine that does not exit)
    is given up on after ``unhealthy_after`` checks in a row, its group stopped, and a new
    one started."""
    supervisor, _ = supervised
    supervisor.configure({"a": entry("a", health_interval_s=0.1, unhealthy_after=3)})
    await supervisor.start()
    await until(ready(supervisor, "a"))
    before = rows(supervisor)["a"]
    with capture_logs() as logs:
        await ask(before["address"], "sick")
        await until(lambda: rows(supervisor)["a"]["restarts"] == 1)
        await until(ready(supervisor, "a"))
    after = rows(supervisor)["a"]
    assert after["pid"] != before["pid"] and group_gone(before["pid"])
    crashed = [e for e in logs if e["event"] == "worker.crashed"]
    assert [e["reason"] for e in crashed] == ["unhealthy"]
    assert "worker=a" in await ask(after["address"])  # the new process is healthy


async def test_a_worker_that_exits_on_a_request_is_restarted(
    supervised: tuple[Supervisor, Routing],
) -> None:
    supervisor, _ = supervised
    supervisor.configure({"a": entry("a", "--exit-after", "2")})
    await supervisor.start()
    await until(ready(supervisor, "a"))
    address = rows(supervisor)["a"]["address"]
    await ask(address)
    await ask(address)  # the second answer arrives, then the process exits with code 4
    await until(lambda: rows(supervisor)["a"]["restarts"] == 1)
    await until(ready(supervisor, "a"))
    assert rows(supervisor)["a"]["last_exit_code"] == 4


async def test_a_changed_entry_is_replaced_new_first_and_the_old_one_drains(
    supervised: tuple[Supervisor, Routing],
) -> None:
    supervisor, routing = supervised
    a, b = entry("a"), entry("b", "--tag", "v1")
    supervisor.configure({"a": a, "b": b})
    await supervisor.start()
    await until(ready(supervisor, "a", "b"))
    old_a, old_b = rows(supervisor)["a"], rows(supervisor)["b"]
    in_flight = asyncio.create_task(ask(old_b["address"], "sleep:1.0", stream=True))
    await asyncio.sleep(0.3)  # the stream is running on the old process
    moves = supervisor.configure({"a": a, "b": msgspec.structs.replace(b, args=["--tag", "v2"])})
    assert (moves.keep, moves.replace) == ([("a", 0)], [("b", 0)])
    await until(lambda: len(supervisor.replicas()) == 2 and ready(supervisor, "b")())
    answer = await in_flight  # drained: it finished before the old process was stopped
    assert answer.rstrip().endswith("data: [DONE]")
    assert f"pid={old_b['pid']} tag=v1" in answer
    new_b = rows(supervisor)["b"]
    assert new_b["pid"] != old_b["pid"]
    assert new_b["generation"] == 1
    assert group_gone(old_b["pid"])
    assert rows(supervisor)["a"]["pid"] == old_a["pid"]  # untouched
    assert "tag=v2" in await ask(new_b["address"])
    both = {old_a["address"], old_b["address"], new_b["address"]}
    assert any(set(seen) == both for seen in routing.seen)  # the new one served first
    assert set(routing.seen[-1]) == {old_a["address"], new_b["address"]}


async def test_stop_first_replacement_never_runs_old_and_new_together(
    supervised: tuple[Supervisor, Routing],
) -> None:
    supervisor, routing = supervised
    b = entry("b", "--tag", "v1", replace="stop_first", replicas=2)
    supervisor.configure({"b": b})
    await supervisor.start()
    await until(lambda: [r["state"] for r in supervisor.status()] == ["ready", "ready"])
    old = {row["pid"] for row in supervisor.status()}
    supervisor.configure({"b": msgspec.structs.replace(b, args=["--tag", "v2"])})
    await until(
        lambda: (
            [(r["generation"], r["state"]) for r in supervisor.status()]
            == [(1, "ready"), (1, "ready")]
        )
    )
    assert not old & {row["pid"] for row in supervisor.status()}
    assert max(len(seen) for seen in routing.seen) == 2  # never more than the two replicas
    assert any(len(seen) == 1 for seen in routing.seen)  # one at a time: the other served


async def test_a_removed_entry_drains_and_stops_and_a_new_one_starts(
    supervised: tuple[Supervisor, Routing],
) -> None:
    supervisor, _ = supervised
    a = entry("a")
    supervisor.configure({"a": a})
    await supervisor.start()
    await until(ready(supervisor, "a"))
    old_pid = rows(supervisor)["a"]["pid"]
    moves = supervisor.configure({"c": entry("c")})
    assert (moves.stop, moves.start) == ([("a", 0)], [("c", 0)])
    await until(lambda: list(rows(supervisor)) == ["c"] and ready(supervisor, "c")())
    await until(lambda: len(supervisor.replicas()) == 1)
    assert group_gone(old_pid)


async def test_a_worker_that_never_gets_healthy_is_killed_and_retried(
    supervised: tuple[Supervisor, Routing],
) -> None:
    supervisor, routing = supervised
    supervisor.configure({"slow": entry("slow", "--ready-after", "600", start_timeout_s=0.5)})
    with capture_logs() as logs:
        await supervisor.start()
        first = None
        await until(lambda: rows(supervisor)["slow"]["pid"] is not None)
        first = rows(supervisor)["slow"]["pid"]
        await until(lambda: rows(supervisor)["slow"]["restarts"] >= 1)
    assert group_gone(first)
    crashed = [e for e in logs if e["event"] == "worker.crashed"]
    assert crashed[0]["reason"] == "start_timeout"
    assert routing.seen == []  # it was never served


async def test_a_program_that_cannot_run_backs_off_and_is_never_served(
    supervised: tuple[Supervisor, Routing],
) -> None:
    supervisor, routing = supervised
    missing = entry("x")
    missing = msgspec.structs.replace(missing, command=["/nonexistent/worker", "{port}"])
    supervisor.configure({"x": missing})
    with capture_logs() as logs:
        await supervisor.start()
        await until(lambda: sum(e["event"] == "worker.crashed" for e in logs) >= 2)
    crashed = [e for e in logs if e["event"] == "worker.crashed"]
    assert {e["reason"] for e in crashed} == {"launch_failed"}
    assert [e["delay_s"] for e in logs if e["event"] == "worker.restarting"][:2] == [0.2, 0.4]
    assert rows(supervisor)["x"]["pid"] is None
    assert routing.seen == []
