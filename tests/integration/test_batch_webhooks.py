"""Batch webhooks over real HTTP: a real gateway, a fake OpenAI upstream and a receiver
server. A batch run with the official ``openai`` SDK sends one ``batch.completed`` whose
signature the SDK's ``webhooks.unwrap`` verifies; a receiver that fails twice gets three
attempts with growing gaps; one that always fails ends ``failed`` after the last attempt,
as the admin delivery log shows; a cancel sends ``batch.cancelled``."""

from __future__ import annotations

import base64
import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import openai
import pytest
from openai.types.webhooks import BatchCancelledWebhookEvent, BatchCompletedWebhookEvent

from policies.auth import KeysFile
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-webhooks-0123456789"
CHAT = "/v1/chat/completions"
DEADLINE_S = 30.0
BASE_S = 0.3  # webhook_retry_base_s: waits of 0.3-0.375 s, then 0.6-0.75 s
MAX_ATTEMPTS = 3
FLAKY_FAILURES = 2  # the flaky receiver answers 500 this often per event, then 200
SECRETS = {name: "whsec_" + base64.b64encode(os.urandom(32)).decode() for name in ("a", "g", "i")}
T = TypeVar("T")


@dataclass
class Seen:
    """One request the receiver got."""

    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() on arrival

    @property
    def event(self) -> dict[str, Any]:
        event: dict[str, Any] = json.loads(self.body)
        return event


@dataclass
class Receiver:
    """ASGI app: ``/ok`` answers 200, ``/flaky`` 500 for an event's first
    ``FLAKY_FAILURES`` attempts then 200, ``/down`` always 500. Keeps every request."""

    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        seen = Seen(scope["path"], headers, body, time.monotonic())
        with self.lock:
            self.seen.append(seen)
            earlier = sum(
                1
                for s in self.seen
                if s.headers.get("webhook-id") == seen.headers.get("webhook-id")
            )
        status = 200
        if seen.path == "/down" or (seen.path == "/flaky" and earlier <= FLAKY_FAILURES):
            status = 500
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    def for_batch(self, batch_id: str) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.event["data"]["id"] == batch_id]


@dataclass
class World:
    gateway: Gateway
    fake: FakeOpenAI
    receiver: Receiver
    clients: dict[str, openai.OpenAI]  # by tenant


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("webhooks")
    keys = KeysFile(folder / "keys.json")
    tenant_keys = {name: keys.create(name, "ci")[0] for name in ("acme", "globex", "initech")}
    fake, receiver = FakeOpenAI(), Receiver()
    with serve(fake) as up, serve(receiver) as rx:
        config = f"""
auth: {{admin_key_env: W_ADMIN, keys_file: {folder / "keys.json"}}}
tenants: {{acme: {{}}, globex: {{}}, initech: {{}}}}
ledger: {{path: {folder / "usage.sqlite3"}}}
batch:
  poll_interval_s: 0.2
  webhook_retry_base_s: {BASE_S}
  webhook_max_retry_delay_s: 5
  webhook_max_attempts: {MAX_ATTEMPTS}
  webhook_timeout_s: 5
  webhooks:
    acme: {{url: "{rx.url}/ok", secret_env: W_ACME}}
    globex: {{url: "{rx.url}/flaky", secret_env: W_GLOBEX}}
    initech: {{url: "{rx.url}/down", secret_env: W_INITECH}}
providers:
  oa: {{type: openai, base_url: "{up.url}/v1", api_key_env: W_OA}}
models:
  chat: {{targets: [{{provider: oa, model: m-count}}]}}
  slow: {{targets: [{{provider: oa, model: m-slow}}]}}
"""
        env = {
            "W_ADMIN": ADMIN,
            "W_OA": "sk-upstream",
            "W_ACME": SECRETS["a"],
            "W_GLOBEX": SECRETS["g"],
            "W_INITECH": SECRETS["i"],
        }
        with running_gateway(config, env) as gateway:
            clients = {
                name: openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
                for name, key in tenant_keys.items()
            }
            yield World(gateway, fake, receiver, clients)


def wait_for(probe: Callable[[], T | None], what: str) -> T:
    """``probe()``'s first truthy value, polled until ``DEADLINE_S``."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def start_batch(client: openai.OpenAI, count: int, model: str = "chat") -> str:
    lines = [
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": CHAT,
                "body": {"model": model, "messages": [{"role": "user", "content": f"q{i}"}]},
            }
        )
        for i in range(count)
    ]
    upload = client.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    return batch.id


def delivery_log(world: World, key: str = ADMIN, **params: str) -> httpx.Response:
    return httpx.get(
        world.gateway.url + "/admin/webhook_deliveries",
        params=params,
        headers={"authorization": f"Bearer {key}"},
    )


def ended_row(world: World, batch_id: str) -> dict[str, Any] | None:
    """The batch's one delivery row once it is delivered or failed."""
    rows = delivery_log(world, batch_id=batch_id).json()["data"]
    assert len(rows) <= 1, rows
    return rows[0] if rows and rows[0]["state"] != "pending" else None


def unwrap(seen: Seen, secret: str) -> Any:
    sdk = openai.OpenAI(api_key="sk-unused", base_url="http://127.0.0.1:9/v1")
    return sdk.webhooks.unwrap(seen.body, seen.headers, secret=secret)


def test_a_completed_batch_sends_one_signed_batch_completed(world: World) -> None:
    batch_id = start_batch(world.clients["acme"], 3)
    row = wait_for(lambda: ended_row(world, batch_id), "the delivery")
    assert (row["state"], row["attempts"], row["last_status"]) == ("delivered", 1, 200)
    assert world.clients["acme"].batches.retrieve(batch_id).status == "completed"
    (seen,) = world.receiver.for_batch(batch_id)  # one event: in_progress was not asked for
    assert seen.path == "/ok" and seen.headers["content-type"] == "application/json"
    event = unwrap(seen, SECRETS["a"])
    assert isinstance(event, BatchCompletedWebhookEvent)
    assert event.data.id == batch_id and event.id == seen.headers["webhook-id"] == row["id"]
    assert row["payload"] == seen.event  # the log holds what was sent
    with pytest.raises(openai.InvalidWebhookSignatureError):
        unwrap(seen, SECRETS["g"])  # another tenant's secret does not verify it


def test_a_failing_receiver_is_retried_with_growing_gaps(world: World) -> None:
    batch_id = start_batch(world.clients["globex"], 2)
    row = wait_for(lambda: ended_row(world, batch_id), "the delivery")
    assert (row["state"], row["attempts"]) == ("delivered", FLAKY_FAILURES + 1)
    attempts = world.receiver.for_batch(batch_id)
    assert len(attempts) == FLAKY_FAILURES + 1
    assert {a.headers["webhook-id"] for a in attempts} == {row["id"]}  # one event, resent
    for attempt in attempts:  # every attempt is signed anew and verifies
        assert unwrap(attempt, SECRETS["g"]).type == "batch.completed"
    first, second = (b.at - a.at for a, b in itertools.pairwise(attempts))
    assert first >= BASE_S * 0.9 and second >= 2 * BASE_S * 0.9
    assert second > first


def test_a_receiver_that_always_fails_ends_failed_in_the_log(world: World) -> None:
    batch_id = start_batch(world.clients["initech"], 1)
    row = wait_for(lambda: ended_row(world, batch_id), "the last attempt")
    assert (row["state"], row["attempts"], row["last_status"]) == ("failed", MAX_ATTEMPTS, 500)
    assert row["type"] == "batch.completed" and row["tenant"] == "initech"
    assert row["url"].endswith("/down") and row["last_error"] == "the receiver answered 500"
    assert len(world.receiver.for_batch(batch_id)) == MAX_ATTEMPTS
    failed = delivery_log(world, state="failed", tenant="initech").json()["data"]
    assert batch_id in {r["batch_id"] for r in failed}
    tenant_key = world.clients["initech"].api_key
    assert delivery_log(world, key=tenant_key).status_code == 403  # the operator's log
    assert delivery_log(world, state="lost").status_code == 400


def test_a_cancelled_batch_sends_batch_cancelled(world: World) -> None:
    world.fake.slow_seconds = 0.3
    client = world.clients["acme"]
    batch_id = start_batch(client, 20, model="slow")
    assert client.batches.cancel(batch_id).status in ("cancelling", "cancelled")
    row = wait_for(lambda: ended_row(world, batch_id), "the delivery")
    assert (row["type"], row["state"]) == ("batch.cancelled", "delivered")
    (seen,) = world.receiver.for_batch(batch_id)
    event = unwrap(seen, SECRETS["a"])
    assert isinstance(event, BatchCancelledWebhookEvent) and event.data.id == batch_id
    assert client.batches.retrieve(batch_id).status == "cancelled"
