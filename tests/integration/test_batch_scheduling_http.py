"""Where batch items run, over real HTTP with the official ``openai`` SDK: an alias whose
first target is managed and second a local replica (``type: vllm``, faked with a flippable
``/metrics`` page). With ``batch.managed_after: 1`` every item runs on the local replica
(interactive requests still go to the managed target first); while the replica is
saturated items wait (answered 503 in process and tried again, never queued, never sent to
the managed target) and finish once it has room; an alias with no local target runs its
items where it can. The finished batch carries ``model`` and ``usage`` summed over its
answers."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from tests.fixtures.fake_openai import FakeOpenAI, usage_for
from tests.fixtures.fake_replica import Replica
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway
from tests.integration.test_batches_http import request_line, run_batch, wait_until

ADMIN = "sy-admin-batch-sched-0123456789"


@dataclass
class World:
    gateway: Gateway
    cloud: FakeOpenAI
    replica: Replica
    client: openai.OpenAI


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    cloud, replica = FakeOpenAI(), Replica()
    replica.busy = False
    with serve(cloud) as up, serve(replica) as box:
        config = f"""
auth: {{admin_key_env: S_ADMIN}}
batch: {{managed_after: 1.0, poll_interval_s: 0.1, max_retry_delay_s: 1, concurrency: 4}}
providers:
  cloud: {{type: openai, base_url: "{up.url}/v1"}}
  box:
    type: vllm
    base_url: "{box.url}/v1"
    saturation: {{poll_interval_s: 0.05, max_waiting: 0, stale_after_s: 2}}
    priority_scheduling: true
models:
  mixed:
    targets: [{{provider: cloud, model: m-count}}, {{provider: box, model: m-count}}]
  managed: {{targets: [{{provider: cloud, model: m-count}}]}}
  boxed: {{targets: [{{provider: box, model: m-count}}]}}
"""
        with running_gateway(config, {"S_ADMIN": ADMIN}) as gateway:
            client = openai.OpenAI(base_url=gateway.base_url, api_key=ADMIN, max_retries=0)
            yield World(gateway, cloud, replica, client)


def chat_calls(fake: FakeOpenAI, marker: str) -> int:
    """Chat requests ``fake`` received whose last message carries ``marker``."""
    count = 0
    for request in list(fake.requests):
        messages = (request.json or {}).get("messages") or [{}]
        if marker in str(messages[-1].get("content")):
            count += 1
    return count


def lines(marker: str, count: int, model: str = "mixed") -> list[str]:
    return [request_line(f"{marker}-{i}", f"{marker} {i}", model) for i in range(count)]


def test_items_run_on_the_local_replica_while_interactive_requests_go_managed(world) -> None:
    batch = wait_until(world.client, run_batch(world.client, lines("local", 5)).id)
    assert batch.status == "completed" and batch.request_counts.completed == 5
    assert chat_calls(world.replica.chat, "local") == 5
    assert chat_calls(world.cloud, "local") == 0
    answer = world.client.chat.completions.create(
        model="mixed", messages=[{"role": "user", "content": "interactive"}]
    )
    assert answer.choices[0].message.content
    assert chat_calls(world.cloud, "interactive") == 1  # priority: the managed target first


def priorities(fake: FakeOpenAI, marker: str) -> list[object]:
    """The ``priority`` field of each chat request ``fake`` got for ``marker`` (None: absent)."""
    found = []
    for request in list(fake.requests):
        body = request.json or {}
        if marker in str((body.get("messages") or [{}])[-1].get("content")):
            found.append(body.get("priority"))
    return found


def test_batch_items_reach_a_priority_scheduling_replica_at_priority_one(world) -> None:
    batch = wait_until(world.client, run_batch(world.client, lines("prio", 3)).id)
    assert batch.status == "completed"
    assert priorities(world.replica.chat, "prio") == [1, 1, 1]
    world.client.chat.completions.create(
        model="boxed", messages=[{"role": "user", "content": "asking-now"}]
    )
    assert priorities(world.replica.chat, "asking-now") == [None]  # interactive: untouched


def test_a_finished_batch_names_its_model_and_sums_its_usage(world) -> None:
    batch = wait_until(world.client, run_batch(world.client, lines("usage", 3)).id)
    assert batch.model == "mixed"
    expected = [
        usage_for({"model": "m-count", "messages": [{"content": f"usage {i}"}]}) for i in range(3)
    ]
    assert batch.usage is not None
    assert batch.usage.input_tokens == sum(u["prompt_tokens"] for u in expected)
    assert batch.usage.output_tokens == sum(u["completion_tokens"] for u in expected)
    assert batch.usage.total_tokens == batch.usage.input_tokens + batch.usage.output_tokens


def test_items_wait_for_a_saturated_replica_instead_of_going_managed(world) -> None:
    world.replica.busy = True
    try:
        _until_saturated(world)
        batch = run_batch(world.client, lines("busy", 3))
        _until_retried(world, batch.id)
        found = world.client.batches.retrieve(batch.id)
        assert found.status == "in_progress" and found.request_counts.completed == 0
        assert chat_calls(world.cloud, "busy") == 0
        assert world.gateway.app.state.gateway.queue.depth == 0  # batch items never queue
    finally:
        world.replica.busy = False
    done = wait_until(world.client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 3
    assert chat_calls(world.replica.chat, "busy") == 3 and chat_calls(world.cloud, "busy") == 0


def test_an_alias_without_a_local_target_runs_its_items_managed(world) -> None:
    batch = wait_until(world.client, run_batch(world.client, lines("cloud", 2, "managed")).id)
    assert batch.status == "completed" and chat_calls(world.cloud, "cloud") == 2


def _until_saturated(world: World) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        answer = httpx.get(
            world.gateway.url + "/admin/targets",
            headers={"authorization": f"Bearer {ADMIN}"},
            timeout=10,
        )
        (box,) = [t for t in answer.json()["targets"] if t["target"] == "box/m-count"]
        if box.get("saturated"):
            return
        time.sleep(0.05)
    pytest.fail("the replica never read as saturated")


def _until_retried(world: World, batch_id: str) -> None:
    """Until every item of ``batch_id`` was tried and put back at least twice."""
    path = world.gateway.app.state.jobs.store.path
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with sqlite3.connect(path) as conn:
            (fewest,) = conn.execute(
                "SELECT MIN(attempts) FROM items WHERE batch_id = ?", (batch_id,)
            ).fetchone()
        if fewest is not None and fewest >= 2:
            return
        time.sleep(0.1)
    pytest.fail("the items were not tried again")


def test_a_deferred_item_is_a_queue_refusal_not_a_failed_request(world) -> None:
    metrics = httpx.get(world.gateway.url + "/metrics", timeout=10).text
    deferred = [
        line
        for line in metrics.splitlines()
        if line.startswith('switchyard_queue_rejections_total{reason="batch_no_room"}')
    ]
    assert deferred and float(deferred[0].split()[-1]) >= 6  # three items, twice each
    assert 'status_class="5xx"' not in metrics  # the deferrals are not failed requests
