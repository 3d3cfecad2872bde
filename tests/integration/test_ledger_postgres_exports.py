"""A real gateway (uvicorn on 127.0.0.1, in this process) with ``ledger.backend: postgres``
in front of the fake OpenAI upstream, driven by the official ``openai`` SDK: every answered
request leaves its row in the Postgres table, ``/admin/usage``, ``/v1/usage`` and
``switchyard usage export`` read them back by SQL, an unreachable Postgres answers exports
with 503 (OpenAI's error shape) while requests go on being served and their rows wait in
the spool until Postgres is back."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import psycopg
import pytest

from gateway.cli import usage as cli_usage
from policies.auth import KeysFile
from policies.ledger.postgres_schema import TABLE
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.postgres_server import TcpProxy
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

pytestmark = pytest.mark.anyio
ADMIN = "sk-admin-pg-exports"


@dataclass
class World:
    gateway: Gateway
    keys: dict[str, str]
    dsn: str  # the database, directly
    proxy: TcpProxy  # what the gateway's ledger connects through
    config: str  # the gateway's policy file text


@pytest.fixture
def upstream() -> Iterator[str]:
    app = FakeOpenAI()
    with serve(app) as server:
        yield server.url


@pytest.fixture
async def world(pg_dsn: str, upstream: str, tmp_path: Path):
    port = int(psycopg.conninfo.conninfo_to_dict(pg_dsn).get("port") or 5432)
    proxy = await TcpProxy(port).start()
    keys_file = KeysFile(tmp_path / "keys.json")
    keys = {tenant: keys_file.create(tenant, "pg")[0] for tenant in ("acme", "zeta")}
    config = f"""
auth: {{admin_key_env: PG_ADMIN, keys_file: {tmp_path / "keys.json"}}}
tenants: {{acme: {{}}, zeta: {{}}}}
ledger:
  backend: postgres
  dsn_env: SWITCHYARD_LEDGER_DSN
  spool_path: {tmp_path / "spool.sqlite3"}
  retry_interval_s: 0.2
providers:
  oa: {{type: openai, base_url: "{upstream}/v1", api_key_env: PG_OA}}
models:
  count: {{targets: [{{provider: oa, model: m-count}}]}}
"""
    env = {"PG_ADMIN": ADMIN, "PG_OA": "sk-up", "SWITCHYARD_LEDGER_DSN": proxy.dsn(pg_dsn)}
    with running_gateway(config, env) as gateway:
        yield World(gateway, keys, pg_dsn, proxy, config)
    await proxy.cut()


async def ask(world: World, tenant: str, text: str) -> tuple[str, int]:
    """One chat completion through the SDK; (the gateway's request id, total tokens)."""
    client = openai.AsyncOpenAI(base_url=world.gateway.base_url, api_key=world.keys[tenant])
    raw = await client.chat.completions.with_raw_response.create(
        model="count", messages=[{"role": "user", "content": text}]
    )
    answer = raw.parse()
    await client.close()
    assert answer.usage is not None
    return raw.headers["x-switchyard-request-id"], answer.usage.total_tokens


async def in_table(dsn: str) -> dict[str, tuple[str, int]]:
    """request_id -> (tenant, tokens), read from Postgres directly."""
    sql = f"SELECT request_id, tenant, prompt_tokens + completion_tokens FROM {TABLE}"
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        rows = await (await conn.execute(sql)).fetchall()
    return {rid: (tenant, tokens) for rid, tenant, tokens in rows}


async def export(world: World, path: str, token: str, **params: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=world.gateway.url, timeout=30.0) as client:
        return await client.get(path, params=params, headers={"authorization": f"Bearer {token}"})


def lines(answer: httpx.Response) -> list[dict]:
    assert answer.status_code == 200, answer.text
    return [json.loads(line) for line in answer.text.splitlines() if line]


async def test_rows_land_in_postgres_and_the_exports_read_them(world: World) -> None:
    calls = [("acme" if i % 3 else "zeta", "x" * (i + 1)) for i in range(12)]
    answers = await asyncio.gather(*(ask(world, tenant, text) for tenant, text in calls))
    expected = {
        rid: (tenant, tokens) for (tenant, _), (rid, tokens) in zip(calls, answers, strict=True)
    }
    assert await in_table(world.dsn) == expected  # committed before each answer returned

    everything = lines(await export(world, "/admin/usage", ADMIN))
    assert {r["request_id"]: (r["SubAccountId"], r["ConsumedQuantity"]) for r in everything} == (
        expected
    )
    starts = [r["ChargePeriodStart"] for r in everything]
    assert starts == sorted(starts)  # time order, by SQL

    acme = lines(await export(world, "/v1/usage", world.keys["acme"]))
    assert {r["request_id"] for r in acme} == {k for k, v in expected.items() if v[0] == "acme"}
    denied = await export(world, "/v1/usage", world.keys["acme"], tenant="zeta")
    assert denied.status_code == 403

    days = lines(await export(world, "/admin/usage", ADMIN, group_by="day", tenant="zeta"))
    zeta = [v for v in expected.values() if v[0] == "zeta"]
    assert [(d["requests"], d["ConsumedQuantity"]) for d in days] == [
        (len(zeta), sum(tokens for _, tokens in zeta))
    ]


async def test_an_outage_spools_rows_and_exports_answer_503_until_postgres_is_back(
    world: World,
) -> None:
    before = await ask(world, "acme", "before")
    await world.proxy.cut()
    during = [await ask(world, "acme", f"during {i}") for i in range(5)]  # still served
    answer = await export(world, "/admin/usage", ADMIN)
    assert answer.status_code == 503
    error = answer.json()["error"]
    assert "unreachable" in error["message"] and set(error) == {"message", "type", "param", "code"}
    assert set(await in_table(world.dsn)) == {before[0]}
    await world.proxy.start()
    wanted = {before[0], *(rid for rid, _ in during)}
    deadline = time.monotonic() + 20
    while set(await in_table(world.dsn)) != wanted:  # the spool replays by itself
        assert time.monotonic() < deadline, await in_table(world.dsn)
        await asyncio.sleep(0.1)
    rows = lines(await export(world, "/admin/usage", ADMIN))
    assert sorted(r["request_id"] for r in rows) == sorted(wanted)


async def test_the_cli_exports_from_postgres(world: World, tmp_path, monkeypatch, capsys) -> None:
    ids = [(await ask(world, "zeta", f"cli {i}"))[0] for i in range(3)]
    await ask(world, "acme", "not exported")
    (tmp_path / "cli.yaml").write_text(
        "ledger: {backend: postgres, dsn_env: CLI_DSN, spool_path: "
        f"{tmp_path / 'cli-spool.sqlite3'}}}\n"
    )
    monkeypatch.setenv("CLI_DSN", world.dsn)
    parser = argparse.ArgumentParser()
    cli_usage.add_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / "zeta.jsonl"
    argv = ["usage", "export", "--config", str(tmp_path / "cli.yaml"), "--tenant", "zeta"]
    args = parser.parse_args([*argv, "--out", str(out)])
    assert await asyncio.to_thread(cli_usage.run, args) == 0
    assert sorted(json.loads(line)["request_id"] for line in out.read_text().splitlines()) == (
        sorted(ids)
    )
    assert "rows read: 3" in capsys.readouterr().err

    monkeypatch.delenv("CLI_DSN")
    assert await asyncio.to_thread(cli_usage.run, args) == 1
    assert "ledger.dsn_env: the environment variable CLI_DSN is unset" in capsys.readouterr().err
