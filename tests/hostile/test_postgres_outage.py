"""The Postgres ledger through an outage under load: a real ``switchyard serve`` process with
``ledger.backend: postgres`` on a private PostgreSQL (initdb'd for this module on a free
port, tests/fixtures/postgres_server.py), in front of the fake OpenAI upstream, takes
concurrent chat completions (plain and streamed) from the official ``openai`` SDK while
PostgreSQL is stopped (``pg_ctl stop -m fast``: in-flight commits are cut off) and started
again. Every request is still answered 200; once the gateway's spool has replayed, every
answered request has exactly one row in Postgres (matched by the client's ``x-request-id``:
nothing lost, nothing doubled), the token sums equal what the upstream reported, and the
admin export reads the same rows back."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import psycopg
import pytest

from policies.ledger.postgres_schema import TABLE
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.postgres_server import PostgresServer
from tests.fixtures.server import serve
from tests.integration.processes import GatewayProcess

pytestmark = [pytest.mark.hostile, pytest.mark.anyio]

ADMIN = "sk-admin-pg-outage"
LOAD_S = 7.0
STOP_AT_S, START_AT_S = 2.0, 4.0  # Postgres is away for about two seconds mid-load
WORKERS = 12
REPLAY_WAIT_S = 30.0


@dataclass(frozen=True)
class Answer:
    client_id: str  # the x-request-id we sent (stored as client_request_id)
    prompt_tokens: int  # what the upstream reported
    completion_tokens: int


@pytest.fixture
def gateway(tmp_path: Path, postgres_server: PostgresServer) -> Iterator[GatewayProcess]:
    upstream = FakeOpenAI()
    with ExitStack() as stack:
        up = stack.enter_context(serve(upstream))
        config = tmp_path / "gateway.yaml"
        config.write_text(f"""
server: {{watch_config: false}}
logging: {{level: info}}
auth: {{admin_key_env: H_ADMIN}}
ledger:
  backend: postgres
  dsn_env: SWITCHYARD_LEDGER_DSN
  spool_path: {tmp_path / "spool.sqlite3"}
  timeout_s: 1.0
  retry_interval_s: 0.5
providers:
  oa: {{type: openai, base_url: "{up.url}/v1", api_key_env: H_OA}}
models:
  count: {{targets: [{{provider: oa, model: m-count}}]}}
""")
        env = {
            "H_ADMIN": ADMIN,
            "H_OA": "sk-upstream",
            "SWITCHYARD_LEDGER_DSN": postgres_server.dsn,
        }
        process = GatewayProcess(config, env, tmp_path / "gateway.log")
        stack.callback(process.kill)
        yield process.start()


async def one_call(client: openai.AsyncOpenAI, n: int) -> Answer:
    """A chat completion, streamed for odd ``n``; what the upstream reported for it."""
    client_id = f"pg-{uuid.uuid4().hex[:12]}"
    body = {
        "model": "count",
        "messages": [{"role": "user", "content": "y" * (1 + n % 97)}],
        "extra_headers": {"x-request-id": client_id},
    }
    if n % 2:
        async with client.chat.completions.with_streaming_response.create(
            **body, stream=True, stream_options={"include_usage": True}
        ) as response:
            usage = None
            async for chunk in await response.parse():
                usage = chunk.usage or usage
    else:
        usage = (await client.chat.completions.create(**body)).usage
    assert usage is not None
    return Answer(client_id, usage.prompt_tokens, usage.completion_tokens)


async def worker(client: openai.AsyncOpenAI, index: int, until: float) -> list[Answer]:
    answers = []
    n = index
    while time.monotonic() < until:
        answers.append(await one_call(client, n))  # any status but 200 raises
        n += WORKERS
    return answers


async def outage(server: PostgresServer) -> None:
    await asyncio.sleep(STOP_AT_S)
    await asyncio.to_thread(server.stop, "fast")
    await asyncio.sleep(START_AT_S - STOP_AT_S)
    await asyncio.to_thread(server.start)


async def stored(dsn: str) -> list[tuple[str, int, int]]:
    """(client_request_id, prompt_tokens, completion_tokens) of every row in Postgres."""
    sql = f"SELECT client_request_id, prompt_tokens, completion_tokens FROM {TABLE}"
    try:
        async with await psycopg.AsyncConnection.connect(dsn, connect_timeout=5) as conn:
            return await (await conn.execute(sql)).fetchall()
    except psycopg.errors.UndefinedTable:
        return []


async def test_a_postgres_restart_mid_load_loses_and_doubles_nothing(
    gateway: GatewayProcess, postgres_server: PostgresServer
) -> None:
    until = time.monotonic() + LOAD_S
    async with openai.AsyncOpenAI(
        base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=30.0
    ) as client:
        results = await asyncio.gather(
            outage(postgres_server), *(worker(client, i, until) for i in range(WORKERS))
        )
    answers = [a for batch in results[1:] for a in batch]
    assert postgres_server.running and len(answers) > 2 * WORKERS

    expected = {a.client_id: (a.prompt_tokens, a.completion_tokens) for a in answers}
    deadline = time.monotonic() + REPLAY_WAIT_S
    rows = await stored(postgres_server.dsn)
    while len(rows) < len(answers) and time.monotonic() < deadline:
        await asyncio.sleep(0.25)  # the spool replays once Postgres is back
        rows = await stored(postgres_server.dsn)
    counts = Counter(client_id for client_id, _, _ in rows)
    assert set(counts) == set(expected), (len(set(counts) ^ set(expected)), log_tail(gateway))
    assert max(counts.values()) == 1  # nothing doubled
    assert {cid: (p, c) for cid, p, c in rows} == expected
    assert sum(p for _, p, _ in rows) == sum(a.prompt_tokens for a in answers)
    assert sum(c for _, _, c in rows) == sum(a.completion_tokens for a in answers)

    metrics = httpx.get(gateway.url + "/metrics", timeout=10.0).text
    spooled = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("switchyard_ledger_spooled_rows")
    )
    assert spooled > 0, "the outage never reached the ledger: the test proved nothing"

    export = httpx.get(
        gateway.url + "/admin/usage",
        headers={"authorization": f"Bearer {ADMIN}"},
        timeout=30.0,
    )
    assert export.status_code == 200, export.text
    exported = [json.loads(line) for line in export.text.splitlines() if line]
    assert sorted(r["client_request_id"] for r in exported) == sorted(expected)


def log_tail(gateway: GatewayProcess) -> str:
    return gateway.log_path.read_text()[-3000:]
