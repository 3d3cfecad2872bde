"""The Postgres job store when Postgres goes away (a loopback proxy in front of the real
server is cut: connections die and new ones are refused) and comes back: the store raises
``JobStoreUnavailableError`` (503) and then fails fast on the injected clock for
``retry_interval_s`` without touching the network; a bug is not an outage; a missing DSN
is a configuration error. Through a real gateway: the Files and Batch routes answer 503 in
OpenAI's error shape while interactive traffic is unaffected, and a batch cut off mid-way
finishes after Postgres is back with every custom_id answered exactly once; a gateway that
starts while Postgres is down starts, and serves batches once it is back."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

import httpx
import openai
import psycopg
import pytest

from core.clock import FakeClock
from core.config import ConfigError, parse_config
from policies.jobs import JobStore, job_store
from policies.jobs.errors import JobStoreUnavailableError
from policies.jobs.postgres import PostgresJobs
from policies.store.base import StoreUnavailableError
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.postgres_server import TcpProxy
from tests.fixtures.server import serve
from tests.integration.gateway_harness import running_gateway
from tests.unit.test_jobs_store import ACME

T = TypeVar("T")
RETRY_S = 5.0  # the store's retry_interval_s in the store-level tests (fake clock)
ITEMS, CONCURRENCY = 20, 4
WAIT_S = 60.0  # the longest any wait here may take


def server_port(dsn: str) -> int:
    return int(psycopg.conninfo.conninfo_to_dict(dsn).get("port") or 5432)


# ---------------------------------------------------------------- the store itself
@pytest.fixture
async def proxy(pg_dsn: str) -> AsyncIterator[TcpProxy]:
    forwarder = await TcpProxy(server_port(pg_dsn)).start()
    yield forwarder
    await forwarder.cut()


@pytest.fixture
async def store(pg_dsn: str, proxy: TcpProxy) -> AsyncIterator[JobStore]:
    opened = JobStore(
        PostgresJobs(proxy.dsn(pg_dsn)), FakeClock(), retention_s=3600, retry_interval_s=RETRY_S
    )
    yield opened
    await opened.aclose()


@pytest.mark.anyio
async def test_an_outage_is_a_503_then_fails_fast_until_the_retry_interval(store, proxy):
    uploaded = await store.add_file(ACME, filename="in.jsonl", purpose="batch", content=b"x")
    await proxy.cut()
    with pytest.raises(JobStoreUnavailableError) as caught:
        await store.files(ACME)
    error = caught.value
    assert isinstance(error, StoreUnavailableError) and error.status == 503
    assert error.code == "service_unavailable" and error.retry_after == RETRY_S
    assert "127.0.0.1" not in error.message and error.reason  # the host is for the logs only
    await proxy.start()  # Postgres is back, but the store does not know yet
    tried = proxy.accepted
    with pytest.raises(JobStoreUnavailableError):
        await store.file(ACME, uploaded.id)
    assert proxy.accepted == tried  # failed fast: no connection was even attempted
    store.clock.advance(RETRY_S)
    assert await store.file(ACME, uploaded.id) == uploaded  # nothing was lost
    assert proxy.accepted == tried + 1  # one new connection


@pytest.mark.anyio
async def test_a_store_opened_while_postgres_is_down_migrates_when_it_is_back(store, proxy):
    await proxy.cut()
    with pytest.raises(JobStoreUnavailableError):
        await store.open()
    await proxy.start()
    store.clock.advance(RETRY_S)
    await store.open()
    assert (await store.files(ACME)).data == []


@pytest.mark.anyio
async def test_a_bug_is_not_an_outage(store):
    await store.open()
    with pytest.raises(psycopg.errors.InvalidRowCountInLimitClause):
        await store.files(ACME, limit=-2)  # a bad query: propagated as it is
    assert (await store.files(ACME)).data == []  # at once: no failing fast, same connection
    backend = PostgresJobs("host=unused")
    assert backend.unreachable(psycopg.errors.DeadlockDetected("deadlock detected")) is None
    assert backend.unreachable(psycopg.OperationalError("connection refused")) is not None


def test_a_postgres_store_needs_its_dsn() -> None:
    with pytest.raises(ConfigError, match="backend postgres needs `dsn`"):
        parse_config("batch: {backend: postgres}")
    with pytest.raises(ConfigError, match="only backend postgres uses it"):
        parse_config("batch: {dsn: 'host=db'}")
    config = parse_config("batch: {backend: postgres, dsn_env: JOBS_DSN}")
    with pytest.raises(ConfigError, match=r"batch\.dsn_env: the environment variable JOBS_DSN"):
        job_store(config, FakeClock(), env={})
    assert job_store(config, FakeClock(), env={"JOBS_DSN": "host=db"}).path is None


# ---------------------------------------------------------------- through a real gateway
class ProxyThread:
    """A ``TcpProxy`` in an event loop of its own thread, driven from synchronous tests."""

    def __init__(self, target_port: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.proxy = TcpProxy(target_port)

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout=30)

    def stop(self) -> None:
        self.run(self.proxy.cut())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture
def cut_off(pg_dsn: str) -> Iterator[ProxyThread]:
    forwarder = ProxyThread(server_port(pg_dsn))
    yield forwarder
    forwarder.stop()


def gateway_config(upstream_url: str) -> str:
    return f"""
batch: {{backend: postgres, dsn_env: J_DSN, concurrency: {CONCURRENCY}, lease_s: 2,
        poll_interval_s: 0.1, retry_interval_s: 0.2, yield_above_in_flight: 100}}
providers:
  oa: {{type: openai, base_url: "{upstream_url}/v1", api_key_env: J_OA}}
models:
  slow: {{targets: [{{provider: oa, model: m-slow}}]}}
  fast: {{targets: [{{provider: oa, model: m-count}}]}}
"""


def upload_line(custom_id: str = "x") -> bytes:
    """One request line (its text names its custom_id, so the upstream's log tells)."""
    body = {"model": "slow", "messages": [{"role": "user", "content": custom_id}]}
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions"}
    return json.dumps({**line, "body": body}).encode()


def create_batch(sdk: openai.OpenAI, prefix: str, items: int) -> tuple[str, list[str]]:
    ids = [f"{prefix}{i:03d}" for i in range(items)]
    content = b"\n".join(upload_line(cid) for cid in ids)
    file = sdk.files.create(file=("in.jsonl", content), purpose="batch")
    batch = sdk.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return batch.id, ids


def wait_for(condition: Any, what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


def ended(sdk: openai.OpenAI, batch_id: str) -> Any:
    """The batch once it ended (503s while the store is still failing fast are waited out)."""

    def final() -> Any:
        try:
            batch = sdk.batches.retrieve(batch_id)
        except openai.InternalServerError:
            return None
        return batch if batch.status in ("completed", "failed", "expired", "cancelled") else None

    return wait_for(final, "the batch to end")


def calls(upstream: FakeOpenAI, prefix: str) -> Counter[str]:
    seen: Counter[str] = Counter()
    for request in list(upstream.requests):
        content = ((request.json or {}).get("messages") or [{}])[-1].get("content")
        if isinstance(content, str) and content.startswith(prefix):
            seen[content] += 1
    return seen


def test_the_routes_answer_503_while_postgres_is_down_and_the_batch_finishes_after(
    pg_dsn: str, cut_off: ProxyThread
) -> None:
    cut_off.run(cut_off.proxy.start())
    upstream = FakeOpenAI()
    upstream.slow_seconds = 0.3
    with serve(upstream) as up:
        env = {"J_DSN": cut_off.proxy.dsn(pg_dsn), "J_OA": "sk-upstream"}
        with running_gateway(gateway_config(up.url), env) as gateway:
            sdk = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
            batch_id, ids = create_batch(sdk, "cut-", ITEMS)
            wait_for(lambda: len(calls(upstream, "cut-")) >= CONCURRENCY, "items running")
            cut_off.run(cut_off.proxy.cut())  # mid-batch: running items cannot be recorded

            answer = httpx.get(f"{gateway.base_url}/batches/{batch_id}", timeout=10)
            assert answer.status_code == 503 and int(answer.headers["retry-after"]) >= 1
            error = answer.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert (error["type"], error["code"]) == ("server_error", "service_unavailable")
            assert error["message"].startswith("The batch job store is unreachable")
            assert "127.0.0.1" not in error["message"]  # clients never learn where it lives
            with pytest.raises(openai.InternalServerError) as upload:
                sdk.files.create(file=("in.jsonl", upload_line()), purpose="batch")
            assert upload.value.status_code == 503
            chat = sdk.chat.completions.create(
                model="fast", messages=[{"role": "user", "content": "still here?"}]
            )
            assert chat.choices[0].message.content  # interactive traffic does not notice
            time.sleep(upstream.slow_seconds * 3)  # the running items answer meanwhile

            started = set(calls(upstream, "cut-"))  # nothing new is claimed while it is down
            cut_off.run(cut_off.proxy.start())
            batch = ended(sdk, batch_id)
            assert batch.status == "completed" and batch.request_counts.completed == ITEMS
            output = sdk.files.content(batch.output_file_id).text
            answered = [json.loads(line)["custom_id"] for line in output.splitlines()]
            assert answered == ids  # every item once, in input order
            ran = calls(upstream, "cut-")
            assert set(ran) == set(ids)
            # Items whose answer could not be recorded ran again, once: only items that had
            # started before the store came back (those in flight at the cut, and one whose
            # answer was being written as the cut fell: its commit's outcome was lost with
            # the connection; seen once in CI under load, 5 re-runs for 4 in flight).
            again = {item for item, n in ran.items() if n > 1}
            assert again <= started and max(ran.values()) <= 2, (ran, started)
            assert len(again) <= CONCURRENCY + 1, ran


def test_a_gateway_started_while_postgres_is_down_serves_batches_once_it_is_back(
    pg_dsn: str, cut_off: ProxyThread
) -> None:
    upstream = FakeOpenAI()
    upstream.slow_seconds = 0.0
    with serve(upstream) as up:
        env = {"J_DSN": cut_off.proxy.dsn(pg_dsn), "J_OA": "sk-upstream"}
        with running_gateway(gateway_config(up.url), env) as gateway:  # the proxy is down
            sdk = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
            with pytest.raises(openai.InternalServerError) as listing:
                sdk.files.list()
            assert listing.value.status_code == 503
            cut_off.run(cut_off.proxy.start())
            wait_for(lambda: _lists(sdk), "the store to answer")
            batch_id, _ = create_batch(sdk, "late-", 3)
            batch = ended(sdk, batch_id)
            assert batch.status == "completed" and batch.request_counts.completed == 3


def _lists(sdk: openai.OpenAI) -> bool:
    try:
        sdk.files.list()
    except openai.InternalServerError:
        return False
    return True
