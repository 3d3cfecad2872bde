"""Webhook signing and delivery (gateway/jobs/webhooks.py): the Standard Webhooks test
vector, signatures the official ``openai`` SDK verifies (``webhooks.unwrap``), secrets in
``whsec_`` form only, the back-off schedule, and the sender against a mock receiver on a
real job store (SQLite and Postgres) with a fake clock: delivered on a 2xx, retried with
growing waits, failed after the last attempt, ``Retry-After`` and 410 honoured, nothing
sent unsigned."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import random
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import msgspec
import openai
import pytest
from openai.types.webhooks import BatchCompletedWebhookEvent

from core.clock import FakeClock
from core.config_batch import BatchConfig, WebhookConfig
from core.tenancy import Principal
from gateway.jobs.webhooks import (
    SecretError,
    WebhookSender,
    decode_secret,
    sign,
    signed_headers,
)
from policies.jobs import JobStore
from policies.jobs.jsonl import parse_jsonl
from policies.jobs.objects import BatchCreate, answered_line
from policies.jobs.outbox import JITTER, backoff_s
from policies.jobs.postgres import PostgresJobs
from tests.unit.test_jobs_store import jobs_at

pytestmark = pytest.mark.anyio
ACME = Principal(tenant="acme", key_id="k1", via="api_key")
SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
URL = "https://hooks.example/acme"
BASE_S, CAP_S, MAX_ATTEMPTS = 10.0, 1000.0, 4
Handler = Callable[[httpx.Request], httpx.Response]
__all__ = ["jobs_at"]  # the store's fixture: the sender's tests run on SQLite and Postgres


def settings(**changes: object) -> BatchConfig:
    hook = WebhookConfig(url=URL, secret_env="ACME_SECRET")
    base = BatchConfig(
        webhooks={"acme": hook},
        webhook_max_attempts=MAX_ATTEMPTS,
        webhook_retry_base_s=BASE_S,
        webhook_max_retry_delay_s=CAP_S,
        poll_interval_s=0.05,
    )
    return msgspec.structs.replace(base, **changes)


# ---------------------------------------------------------------- signing
def test_the_standard_webhooks_test_vector() -> None:
    key = decode_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    signature = sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}')
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_the_openai_sdk_verifies_and_unwraps_a_signed_event() -> None:
    body = json.dumps(
        {
            "id": "evt_abc",
            "type": "batch.completed",
            "created_at": 1,
            "data": {"id": "batch_1"},
            "object": "event",
        },
        separators=(",", ":"),
    ).encode()
    headers = signed_headers(decode_secret(SECRET), "evt_abc", int(time.time()), body)
    client = openai.OpenAI(api_key="sk-unused", base_url="http://127.0.0.1:9/v1")
    event = client.webhooks.unwrap(body, headers, secret=SECRET)
    assert isinstance(event, BatchCompletedWebhookEvent) and event.data.id == "batch_1"
    with pytest.raises(openai.InvalidWebhookSignatureError):
        client.webhooks.verify_signature(
            body.replace(b"batch_1", b"batch_2"), headers, secret=SECRET
        )
    other = "whsec_" + base64.b64encode(bytes(32)).decode()
    with pytest.raises(openai.InvalidWebhookSignatureError):
        client.webhooks.verify_signature(body, headers, secret=other)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (None, "not set"),
        ("", "not set"),
        (base64.b64encode(bytes(32)).decode(), "must start with 'whsec_'"),
        ("whsec_not*base64", "not valid base64"),
        ("whsec_" + base64.b64encode(bytes(16)).decode(), "24 to 64 bytes, not 16"),
    ],
)
def test_secrets_must_be_whsec_base64_of_enough_bytes(text: str | None, problem: str) -> None:
    with pytest.raises(SecretError, match=problem):
        decode_secret(text, "ACME_SECRET")


def test_backoff_doubles_with_bounded_jitter_up_to_the_cap() -> None:
    rng = random.Random(3)
    waits = [backoff_s(n, base_s=BASE_S, cap_s=CAP_S, rng=rng) for n in range(1, 11)]
    for n, wait in enumerate(waits[:6], start=1):
        low = BASE_S * 2 ** (n - 1)
        assert low <= wait <= low * (1 + JITTER)
    assert all(a < b for a, b in itertools.pairwise(waits[:7]))  # growing
    assert waits[-1] == CAP_S
    assert backoff_s(10_000, base_s=1.0, cap_s=5.0, rng=rng) == 5.0  # no overflow


# ---------------------------------------------------------------- the sender
class Receiver:
    """A mock receiver: answers with ``answer(request)`` and keeps every request."""

    def __init__(self, answer: Handler) -> None:
        self.answer = answer
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.answer(request)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(wall_start=time.time())  # the SDK checks timestamps against real time


@pytest.fixture
async def store(jobs_at: Path | PostgresJobs, clock: FakeClock) -> AsyncIterator[JobStore]:
    store = JobStore(jobs_at, clock, retention_s=86_400)
    store.webhooks = settings().webhooks
    await store.open()
    yield store
    await store.aclose()


async def completed(store: JobStore) -> str:
    """A one-request batch run to ``completed``: its ``batch.completed`` is queued."""
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    line = {"custom_id": "r0", "method": "POST", "url": "/v1/chat/completions", "body": body}
    content = json.dumps(line).encode()
    file = await store.add_file(ACME, filename="in.jsonl", purpose="batch", content=content)
    create = BatchCreate(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = await store.create_batch(ACME, create, 86_400)
    (pending,) = await store.validating(1)
    assert await store.start(pending, parse_jsonl(content)[0])
    (item,) = await store.claim("runner", 1, 60.0)
    await store.finish("runner", item, ok=True, result=answered_line("r0", 200, "req", b"{}"))
    assert await store.finalize(batch.id)
    return batch.id


def sender_for(
    store: JobStore, receiver: Receiver, config: BatchConfig | None = None, **env: str
) -> WebhookSender:
    client = httpx.AsyncClient(transport=httpx.MockTransport(receiver))
    environment = env if env else {"ACME_SECRET": SECRET}
    current = config or settings()
    return WebhookSender(store, client, lambda: current, environment, "me", random.Random(5))


async def test_a_delivery_is_signed_so_the_openai_sdk_verifies_it(store):
    batch_id = await completed(store)
    receiver = Receiver(lambda _: httpx.Response(204))
    assert await sender_for(store, receiver).send_due() == 1
    (request,) = receiver.requests
    assert (request.method, str(request.url)) == ("POST", URL)
    assert request.headers["content-type"] == "application/json"
    client = openai.OpenAI(api_key="sk-unused", base_url="http://127.0.0.1:9/v1")
    event = client.webhooks.unwrap(request.content, dict(request.headers), secret=SECRET)
    assert isinstance(event, BatchCompletedWebhookEvent)
    assert event.data.id == batch_id and request.headers["webhook-id"] == event.id
    (row,) = await store.deliveries()
    assert (row.state, row.attempts, row.last_status, row.url) == ("delivered", 1, 204, URL)
    assert await sender_for(store, receiver).send_due() == 0  # nothing left to send


async def test_a_failing_receiver_is_retried_with_growing_waits_then_failed(store, clock):
    await completed(store)
    receiver = Receiver(lambda _: httpx.Response(500))
    sender = sender_for(store, receiver)
    waits = []
    for attempt in range(1, MAX_ATTEMPTS + 1):
        assert await sender.send_due() == 1
        (row,) = await store.deliveries()
        assert row.attempts == attempt and row.last_status == 500
        if attempt < MAX_ATTEMPTS:
            assert row.state == "pending" and row.next_attempt_at is not None
            waits.append(row.next_attempt_at - clock.wall())
            assert await sender.send_due() == 0  # not before its time
            clock.advance(waits[-1])
    assert row.state == "failed" and row.last_error == "the receiver answered 500"
    for n, wait in enumerate(waits, start=1):
        assert BASE_S * 2 ** (n - 1) <= wait <= BASE_S * 2 ** (n - 1) * (1 + JITTER)
    assert {r.headers["webhook-id"] for r in receiver.requests} == {row.id}  # one event
    stamps = [int(r.headers["webhook-timestamp"]) for r in receiver.requests]
    assert stamps == sorted(stamps) and stamps[0] < stamps[-1]  # each attempt signs anew
    clock.advance(CAP_S * 10)
    assert await sender.send_due() == 0


async def test_retry_after_is_honoured_and_410_ends_it_at_once(store, clock):
    await completed(store)
    answers = iter([httpx.Response(503, headers={"retry-after": "300"}), httpx.Response(410)])
    sender = sender_for(store, Receiver(lambda _: next(answers)))
    await sender.send_due()
    (row,) = await store.deliveries()
    assert row.next_attempt_at == pytest.approx(clock.wall() + 300)  # longer than 10 s
    clock.advance(300)
    await sender.send_due()
    (row,) = await store.deliveries()
    assert (row.state, row.attempts, row.last_status) == ("failed", 2, 410)


async def test_without_its_secret_nothing_is_sent_and_the_attempt_fails(store):
    await completed(store)
    receiver = Receiver(lambda _: httpx.Response(200))
    assert await sender_for(store, receiver, OTHER="x").send_due() == 1
    assert receiver.requests == []
    (row,) = await store.deliveries()
    assert (row.state, row.attempts, row.last_status) == ("pending", 1, None)
    assert row.last_error == "environment variable ACME_SECRET is not set"


async def test_an_unreachable_receiver_is_a_failed_attempt(store):
    await completed(store)

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    await sender_for(store, Receiver(refuse)).send_due()
    (row,) = await store.deliveries()
    assert (row.state, row.attempts, row.last_status) == ("pending", 1, None)
    assert row.last_error == "ConnectError: connection refused"


async def test_an_event_whose_webhook_was_removed_fails(store):
    await completed(store)
    receiver = Receiver(lambda _: httpx.Response(200))
    await sender_for(store, receiver, settings(webhooks={})).send_due()
    (row,) = await store.deliveries()
    assert (row.state, row.attempts, receiver.requests) == ("failed", 1, [])
    assert row.last_error == "batch.webhooks has no entry 'acme' any more"


async def test_the_running_sender_delivers_and_hands_back_on_close(store):
    await completed(store)
    receiver = Receiver(lambda _: httpx.Response(200))
    sender = sender_for(store, receiver)
    sender.start()
    try:
        deadline = time.monotonic() + 10
        while not await store.deliveries(state="delivered"):
            assert time.monotonic() < deadline, "the sender never delivered"
            await asyncio.sleep(0.01)
    finally:
        await sender.aclose(grace_s=1.0)
    assert len(receiver.requests) == 1
