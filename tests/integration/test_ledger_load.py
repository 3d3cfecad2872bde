"""The usage ledger under load, end to end: 1,000 concurrent requests from two tenants
(plain and streamed, prompts of many lengths, and streams that the client abandons after the
first chunk) leave exactly one row each, with the tokens the upstream reported, status 499
for the abandoned ones, and per-tenant exports whose sums equal the rows'.

Everything runs in this process: the fake upstream and the gateway under uvicorn in
threads, the client on an asyncio loop (httpx, at most ``CONCURRENCY`` requests at once so
two cores cope). The SQLite ledger lives in a temporary folder."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from policies.auth import KeysFile
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import ServerThread
from tests.integration.gateway_harness import Gateway, running_gateway

pytestmark = pytest.mark.anyio

ADMIN = "sy-admin-load-0123456789abcdef"
TOTAL = 1000
CONCURRENCY = 200
ABANDON_EVERY = 10  # ~10% of the requests are streams the client walks away from
COMPLETION_TOKENS = 5  # what the fake's m-count reports as completion tokens
INPUT_PER_MTOK, OUTPUT_PER_MTOK = 3.0, 7.0
Row = dict[str, Any]  # one exported line


@contextmanager
def long_keepalive(app: FakeOpenAI) -> Iterator[ServerThread]:
    """The fake upstream with a keep-alive longer than the gateway's pool keeps idle
    connections (30 s). With uvicorn's default of 5 s the upstream closes idle pooled
    connections, and a reuse that races the close fails with 502 ("Can not write request
    body"): a known transport issue, reported separately, not what this test is about."""
    server = ServerThread(app)
    server.server.config.timeout_keep_alive = 120
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class World:
    gateway: Gateway
    upstream: FakeOpenAI
    keys: dict[str, str]  # tenant -> API key


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("ledger-load")
    keys_file = KeysFile(folder / "keys.json")
    keys = {tenant: keys_file.create(tenant, "load")[0] for tenant in ("acme", "globex")}
    upstream = FakeOpenAI()
    upstream.slow_seconds = 20.0  # an abandoned stream is always cut mid-stream
    price = f"{{input_per_mtok: {INPUT_PER_MTOK}, output_per_mtok: {OUTPUT_PER_MTOK}}}"
    with long_keepalive(upstream) as up:
        config = f"""
auth: {{admin_key_env: L_ADMIN, keys_file: {folder / "keys.json"}}}
tenants:
  acme: {{limits: {{rpm: 100000, tpm: 100000000, concurrency: 5000}}}}
  globex: {{limits: {{rpm: 100000}}}}
ledger: {{path: {folder / "usage.sqlite3"}}}
providers:
  oa: {{type: openai, base_url: "{up.url}/v1", api_key_env: L_OA}}
models:
  count: {{targets: [{{provider: oa, model: m-count, price: {price}}}]}}
  slow: {{targets: [{{provider: oa, model: m-slow-stream}}]}}
"""
        env = {"L_ADMIN": ADMIN, "L_OA": "sk-upstream"}
        with running_gateway(config, env) as gateway:
            yield World(gateway, upstream, keys)


@dataclass(frozen=True)
class Call:
    """One planned request and what the fake upstream will report for it."""

    request_id: str
    tenant: str
    text: str
    stream: bool
    abandon: bool

    @property
    def body(self) -> dict[str, object]:
        model = "slow" if self.abandon else "count"
        return {
            "model": model,
            "stream": self.stream,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": self.text},
            ],
        }


def plan_calls(seed: int) -> list[Call]:
    rng = random.Random(seed)
    calls = []
    for i in range(TOTAL):
        abandon = i % ABANDON_EVERY == 3
        calls.append(
            Call(
                request_id=f"load-{seed}-{i:04d}",
                tenant=rng.choice(("acme", "globex")),
                text="x" * rng.randint(1, 600),
                stream=abandon or rng.random() < 0.5,
                abandon=abandon,
            )
        )
    return calls


async def send(client: httpx.AsyncClient, world: World, call: Call) -> tuple[int, str]:
    """Make one call; (status, the x-request-id the gateway answered with). An abandoned
    stream is closed right after its first chunk."""
    headers = {
        "authorization": f"Bearer {world.keys[call.tenant]}",
        "x-request-id": call.request_id,
    }
    async with client.stream(
        "POST", "/v1/chat/completions", json=call.body, headers=headers
    ) as response:
        if call.abandon:
            async for _ in response.aiter_raw():
                break  # one chunk, then the client goes away mid-stream
            return response.status_code, response.headers.get("x-request-id", "")
        text = (await response.aread()).decode()
        assert response.status_code == 200, text
        if call.stream:
            assert text.rstrip().endswith("data: [DONE]"), text[-300:]
        return response.status_code, response.headers["x-request-id"]


async def run_load(world: World, calls: list[Call]) -> list[tuple[int, str]]:
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    gate = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(base_url=world.gateway.url, limits=limits, timeout=60.0) as client:

        async def bounded(call: Call) -> tuple[int, str]:
            async with gate:
                return await send(client, world, call)

        return await asyncio.gather(*(bounded(c) for c in calls))


def export(world: World, path: str, token: str, **params: str) -> str:
    answer = httpx.get(
        world.gateway.url + path,
        params=params,
        headers={"authorization": f"Bearer {token}"},
        timeout=30.0,
    )
    assert answer.status_code == 200, answer.text
    return answer.text


def ledger_rows(world: World, ids: set[str], timeout_s: float = 20.0) -> list[Row]:
    """Every row whose request id is in ``ids``, once all of them are there (abandoned
    streams commit their rows after the client left, so the last ones may lag a little)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = export(world, "/admin/usage", ADMIN)
        rows = [json.loads(line) for line in text.splitlines() if line]
        mine = [r for r in rows if r["client_request_id"] in ids]
        if len({r["client_request_id"] for r in mine}) >= len(ids) or time.monotonic() > deadline:
            return mine
        time.sleep(0.2)


def cost(prompt: int, completion: int) -> float:
    return (prompt * INPUT_PER_MTOK + completion * OUTPUT_PER_MTOK) / 1e6


async def test_one_row_per_request_under_load_with_exact_sums(world: World) -> None:
    calls = plan_calls(seed=1)
    by_id = {c.request_id: c for c in calls}
    answers = await run_load(world, calls)
    assert [rid for _, rid in answers] == [c.request_id for c in calls]
    assert all(status == 200 for status, _ in answers)

    rows = ledger_rows(world, set(by_id))
    counts = Counter(r["client_request_id"] for r in rows)
    assert len(rows) == TOTAL and set(counts) == set(by_id), counts.most_common(3)

    completed = [r for r in rows if not by_id[r["client_request_id"]].abandon]
    abandoned = [r for r in rows if by_id[r["client_request_id"]].abandon]
    assert len(abandoned) == TOTAL // ABANDON_EVERY
    assert {r["status"] for r in abandoned} == {499}
    assert {r["status"] for r in completed} == {200}
    for r in rows:
        call = by_id[r["client_request_id"]]
        assert (r["SubAccountId"], r["stream"]) == (call.tenant, call.stream)
    # m-count reports the last message's length as prompt tokens and 5 completion tokens.
    assert sum(r["prompt_tokens"] for r in completed) == sum(
        len(by_id[r["client_request_id"]].text) for r in completed
    )
    assert sum(r["completion_tokens"] for r in completed) == COMPLETION_TOKENS * len(completed)
    for r in completed:
        prompt = len(by_id[r["client_request_id"]].text)
        assert (r["prompt_tokens"], r["completion_tokens"]) == (prompt, COMPLETION_TOKENS)
        assert r["BilledCost"] == pytest.approx(cost(prompt, COMPLETION_TOKENS), rel=1e-9)
    assert world.upstream.disconnects >= len(abandoned)  # really cut mid-stream upstream

    for tenant, key in world.keys.items():
        mine = [r for r in rows if r["SubAccountId"] == tenant]
        assert_day_export_matches(
            export(world, "/v1/usage", key, format="csv", group_by="day"), mine
        )


def assert_day_export_matches(text: str, rows: list[Row]) -> None:
    """The CSV per-day export of one tenant sums to exactly the sums over its rows."""
    groups = list(csv.DictReader(io.StringIO(text)))
    assert groups and {g["SubAccountId"] for g in groups} == {rows[0]["SubAccountId"]}

    def total(column: str) -> int:
        return sum(int(g[column]) for g in groups)

    assert total("requests") == len(rows)
    assert total("errors") == sum(r["status"] >= 400 for r in rows)
    for column in ("prompt_tokens", "completion_tokens", "ConsumedQuantity"):
        assert total(column) == sum(r[column] for r in rows), column
    billed = sum(float(g["BilledCost"]) for g in groups)
    assert billed == pytest.approx(sum(r["BilledCost"] for r in rows), abs=1e-11)
    assert billed > 0
