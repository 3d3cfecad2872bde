"""The admission queue over real HTTP: an in-process gateway whose alias has one target, a
local replica (``type: vllm``) faked by a small ASGI app: its ``/metrics`` page can be
flipped between busy (3 requests waiting: saturated) and idle, and its chat endpoint is the
fake OpenAI app.

While the replica is saturated requests wait in the queue instead of failing; when its
metrics turn idle they are served with ``x-switchyard-queue-ms``. Past the alias's
``queue_deadline_s`` a waiter gets 503 with Retry-After; with ``queue.max_size: 1`` a second
concurrent waiter gets 429 with Retry-After at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.fixtures.fake_replica import Replica
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-queue-0123456789abcdef"
LABEL = "replica/m-local"


@dataclass
class World:
    gateway: Gateway
    replica: Replica


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    replica = Replica()
    with serve(replica) as server:
        config = f"""
auth: {{admin_key_env: T_ADMIN}}
routing: {{queue: {{max_size: 1, deadline_s: 10}}}}
providers:
  replica:
    type: vllm
    base_url: "{server.url}/v1"
    saturation: {{poll_interval_s: 0.05, max_waiting: 0, stale_after_s: 2}}
models:
  patient: {{queue_deadline_s: 20, targets: [{{provider: replica, model: m-local}}]}}
  hasty: {{queue_deadline_s: 0.5, targets: [{{provider: replica, model: m-local}}]}}
"""
        with running_gateway(config, {"T_ADMIN": ADMIN}) as gateway:
            yield World(gateway, replica)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=4) as executor:
        yield executor


def chat(world: World, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}]}
    return httpx.post(world.gateway.base_url + "/chat/completions", json=body, timeout=60)


def replica_health(world: World) -> dict[str, Any]:
    answer = httpx.get(
        world.gateway.url + "/admin/targets",
        headers={"authorization": f"Bearer {ADMIN}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    (found,) = [t for t in answer.json()["targets"] if t["target"] == LABEL]
    return dict(found)


def eventually(condition: Callable[[], bool], limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def queue_depth(world: World) -> int:
    depth: int = world.gateway.app.state.gateway.queue.depth
    return depth


def make_busy(world: World) -> None:
    """Flip the replica to busy and wait until the gateway's poll has seen its queue."""
    world.replica.busy = True
    eventually(lambda: (h := replica_health(world))["saturated"] and h["waiting"] >= 3)


def test_waiters_are_served_when_the_replica_frees_up(
    world: World, pool: ThreadPoolExecutor
) -> None:
    make_busy(world)
    before = world.replica.calls()
    waiting: Future[httpx.Response] = pool.submit(chat, world, "patient")
    eventually(lambda: queue_depth(world) == 1)
    assert not waiting.done()  # queued, not failed at once
    assert world.replica.calls() == before  # nothing was sent to the busy replica

    world.replica.busy = False
    answer = waiting.result(timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "Hello from openai!"
    assert answer.headers["x-switchyard-provider"] == "replica"
    assert int(answer.headers["x-switchyard-queue-ms"]) > 0
    assert world.replica.calls() == before + 1
    assert queue_depth(world) == 0

    # Idle: the next request does not queue at all (and says so).
    again = chat(world, "patient")
    assert again.status_code == 200
    assert "x-switchyard-queue-ms" not in again.headers


def test_a_waiter_past_its_deadline_gets_503_with_retry_after(world: World) -> None:
    make_busy(world)
    before = world.replica.calls()
    answer = chat(world, "hasty")  # the alias's queue deadline is 0.5 s
    assert answer.status_code == 503, answer.text
    assert int(answer.headers["retry-after"]) >= 1
    error = answer.json()["error"]
    assert "queue deadline" in error["message"]
    assert world.replica.calls() == before
    assert queue_depth(world) == 0


def test_a_second_waiter_beyond_max_size_gets_429(world: World, pool: ThreadPoolExecutor) -> None:
    make_busy(world)
    before = world.replica.calls()
    first: Future[httpx.Response] = pool.submit(chat, world, "patient")
    eventually(lambda: queue_depth(world) == 1)

    second = chat(world, "patient")
    assert second.status_code == 429, second.text
    assert int(second.headers["retry-after"]) >= 1
    assert "queue is full" in second.json()["error"]["message"]
    assert not first.done()  # the first waiter keeps its place

    world.replica.busy = False
    answer = first.result(timeout=30)
    assert answer.status_code == 200, answer.text
    assert "x-switchyard-queue-ms" in answer.headers
    assert world.replica.calls() == before + 1
