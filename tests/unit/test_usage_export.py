"""Usage exports: filter parsing, CSV/JSON Lines shape, group_by sums, streaming, the two
HTTP routes (real Authenticator, real SQLite ledger) and the CLI."""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import math
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from litestar import Litestar
from litestar.testing import AsyncTestClient

from core.clock import FakeClock
from core.config import load_config
from core.errors import InvalidRequestError
from core.tenancy import UsageRow
from gateway.cli import usage as cli_usage
from gateway.http.errors import exception_handlers
from gateway.routes.usage import admin_usage, tenant_usage
from policies.auth import Authenticator
from policies.auth.keys import KeysFile
from policies.ledger.export import (
    GROUP_COLUMNS,
    RAW_COLUMNS,
    export_lines,
    iso,
    parse_query,
    parse_time,
    prime,
)
from policies.ledger.sqlite import SqliteLedger

pytestmark = pytest.mark.anyio
MAY1 = datetime(2024, 5, 1, tzinfo=UTC).timestamp()


def row(i: int, **extra) -> UsageRow:
    fields = {
        "request_id": f"req_{i:04d}",
        "ts": MAY1 + i * 3600.0,
        "tenant": "acme",
        "key_id": "key_a",
        "model": "fast",
        "provider": "oa",
        "upstream_model": "gpt-4o-mini",
        "prompt_tokens": 100 + i,
        "completion_tokens": 20,
        "cached_tokens": 10,
        "cost_usd": 0.0000075 * (i + 1),
        "latency_ms": 1500.0,
        **extra,
    }
    return UsageRow(**fields)


async def source(rows: Iterable[UsageRow]) -> AsyncIterator[UsageRow]:
    for r in rows:
        yield r


async def collect(lines: AsyncIterator[bytes]) -> bytes:
    return b"".join([line async for line in lines])


# ---------------------------------------------------------------- filters


@pytest.mark.parametrize(
    ("text", "end", "expected"),
    [
        ("2024-05-01", False, MAY1),
        ("2024-05-01", True, MAY1 + 86400),  # a date as the end includes that day
        ("2024-05-01T06:00:00Z", False, MAY1 + 6 * 3600),
        ("2024-05-01T06:00:00", True, MAY1 + 6 * 3600),  # naive means UTC
        ("2024-05-01T08:00:00+02:00", False, MAY1 + 6 * 3600),
        ("1714521600", False, MAY1),
        ("1714521600.5", True, MAY1 + 0.5),
        (" 2024-05-01 ", False, MAY1),
        ("", False, None),
        (None, False, None),
    ],
)
def test_times_parse_as_utc(text, end, expected):
    assert parse_time(text, "from", end=end) == expected


@pytest.mark.parametrize("text", ["yesterday", "2024-13-01", "2024-05-01T25:00", "nan", "inf"])
def test_bad_times_name_their_parameter(text):
    with pytest.raises(InvalidRequestError) as caught:
        parse_time(text, "to")
    assert caught.value.param == "to"
    assert caught.value.status == 400


def test_parse_query_validates_every_field():
    query = parse_query(tenant=" acme ", start="2024-05-01", end="2024-05-31", group_by="DAY")
    assert (query.tenant, query.start, query.group_by, query.fmt) == ("acme", MAY1, "day", "jsonl")
    assert query.end == MAY1 + 31 * 86400
    for kwargs, param in [
        ({"group_by": "week"}, "group_by"),
        ({"fmt": "xlsx"}, "format"),
        ({"start": "2024-05-02", "end": "2024-05-01"}, "to"),
        ({"start": "x"}, "from"),
    ]:
        with pytest.raises(InvalidRequestError) as caught:
            parse_query(**kwargs)
        assert caught.value.param == param


# ---------------------------------------------------------------- shapes


async def test_csv_has_the_header_then_one_line_per_row():
    rows = [row(0), row(1, tenant=None, key_id=None, error="upstream_timeout", status=504)]
    body = await collect(export_lines(source(rows), "csv"))
    assert body.endswith(b"\r\n") and body.count(b"\r\n") == 3
    table = list(csv.reader(io.StringIO(body.decode(), newline="")))
    assert tuple(table[0]) == RAW_COLUMNS
    first = dict(zip(RAW_COLUMNS, table[1], strict=True))
    assert first["request_id"] == "req_0000"
    assert first["ChargePeriodStart"] == "2024-05-01T00:00:00.000Z"
    assert first["ChargePeriodEnd"] == "2024-05-01T00:00:01.500Z"
    assert first["SubAccountId"] == "acme" and first["ResourceId"] == "gpt-4o-mini"
    assert first["BilledCost"] == first["EffectiveCost"] == "0.0000075"  # fixed point
    assert first["ConsumedQuantity"] == "120" and first["ConsumedUnit"] == "Tokens"
    assert first["BillingCurrency"] == "USD" and first["ChargeCategory"] == "Usage"
    assert first["stream"] == "false" and first["ttft_ms"] == "" and first["error"] == ""
    second = dict(zip(RAW_COLUMNS, table[2], strict=True))
    assert second["SubAccountId"] == "" and second["status"] == "504"
    assert second["error"] == "upstream_timeout"


async def test_jsonl_has_one_object_per_row_with_the_csv_columns():
    rows = [row(i) for i in range(3)]
    body = await collect(export_lines(source(rows), "jsonl"))
    lines = body.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 4
    records = [json.loads(line) for line in lines[:-1]]
    assert [tuple(r) for r in records] == [RAW_COLUMNS] * 3
    assert [r["request_id"] for r in records] == ["req_0000", "req_0001", "req_0002"]
    assert records[2]["BilledCost"] == rows[2].cost_usd
    assert records[0]["ttft_ms"] is None and records[0]["stream"] is False
    assert records[1]["ChargePeriodStart"] == "2024-05-01T01:00:00.000Z"


async def test_csv_quotes_what_needs_quoting():
    body = await collect(export_lines(source([row(0, model='a,"b"\nc')]), "csv"))
    table = list(csv.reader(io.StringIO(body.decode(), newline="")))
    assert table[1][RAW_COLUMNS.index("model")] == 'a,"b"\nc'


async def test_group_by_day_splits_days_and_tenants():
    rows = [row(i, tenant=["acme", "zeta"][i % 2]) for i in range(48)]  # two days, hourly
    body = await collect(export_lines(source(rows), "jsonl", "day"))
    groups = [json.loads(line) for line in body.splitlines()]
    assert [(g["ChargePeriodStart"][:10], g["SubAccountId"]) for g in groups] == [
        ("2024-05-01", "acme"),
        ("2024-05-01", "zeta"),
        ("2024-05-02", "acme"),
        ("2024-05-02", "zeta"),
    ]
    assert [tuple(g) for g in groups] == [GROUP_COLUMNS] * 4
    assert groups[0]["ChargePeriodEnd"] == "2024-05-02T00:00:00.000Z"
    assert all(g["requests"] == 12 for g in groups)
    assert groups[0]["model"] is None and groups[0]["key_id"] is None


async def test_group_by_model_and_key_keep_their_dimensions():
    rows = [
        row(0, key_id="k1", provider="oa", upstream_model="m1"),
        row(1, key_id="k2", provider="oa", upstream_model="m1"),
        row(2, key_id="k1", provider="ant", upstream_model="m2", status=502),
    ]
    by_model = [
        json.loads(line)
        for line in (await collect(export_lines(source(rows), "jsonl", "model"))).splitlines()
    ]
    assert [(g["provider"], g["ResourceId"], g["requests"]) for g in by_model] == [
        ("ant", "m2", 1),
        ("oa", "m1", 2),
    ]
    assert by_model[0]["errors"] == 1 and by_model[1]["errors"] == 0
    assert by_model[1]["ChargePeriodStart"] == iso(rows[0].ts)
    assert by_model[1]["ChargePeriodEnd"] == iso(rows[1].ts + 1.5)
    body = await collect(export_lines(source(rows), "csv", "key"))
    table = list(csv.reader(io.StringIO(body.decode(), newline="")))
    assert tuple(table[0]) == GROUP_COLUMNS
    keys = {r[GROUP_COLUMNS.index("key_id")]: r[GROUP_COLUMNS.index("requests")] for r in table[1:]}
    assert keys == {"k1": "2", "k2": "1"}


usage_rows = st.lists(
    st.builds(
        lambda i, tenant, key, model, hours, prompt, completion, cached, cost: row(
            i,
            tenant=tenant,
            key_id=key,
            model=model,
            ts=MAY1 + hours * 3600.0,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=cached,
            cost_usd=cost,
        ),
        st.integers(0, 9999),
        st.sampled_from(["acme", "zeta", None]),
        st.sampled_from(["k1", "k2", None]),
        st.sampled_from(["fast", "smart"]),
        st.floats(0, 24 * 5),
        st.integers(0, 100_000),
        st.integers(0, 100_000),
        st.integers(0, 1000),
        st.floats(0, 5, allow_nan=False) | st.integers(1, 10**6).map(lambda n: n * 1e-9),
    ),
    max_size=60,
)


@settings(max_examples=80, deadline=None)
@given(usage_rows, st.sampled_from(["day", "model", "key"]), st.sampled_from(["jsonl", "csv"]))
def test_group_sums_equal_the_sums_of_the_rows(rows, group_by, fmt):
    body = asyncio.run(collect(export_lines(source(rows), fmt, group_by)))
    if fmt == "jsonl":
        groups = [json.loads(line) for line in body.splitlines()]
    else:
        table = list(csv.reader(io.StringIO(body.decode(), newline="")))
        groups = [dict(zip(GROUP_COLUMNS, r, strict=True)) for r in table[1:]]
    assert sum(int(g["requests"]) for g in groups) == len(rows)
    for column, field in [
        ("prompt_tokens", "prompt_tokens"),
        ("completion_tokens", "completion_tokens"),
        ("cached_tokens", "cached_tokens"),
    ]:
        assert sum(int(g[column]) for g in groups) == sum(getattr(r, field) for r in rows)
    assert sum(int(g["ConsumedQuantity"]) for g in groups) == sum(
        r.prompt_tokens + r.completion_tokens for r in rows
    )
    total = math.fsum(float(g["BilledCost"]) for g in groups)
    assert total == pytest.approx(math.fsum(r.cost_usd for r in rows), rel=1e-12, abs=1e-11)
    # each group's own totals, recomputed here
    per_tenant: dict[object, float] = defaultdict(float)
    for r in rows:
        per_tenant[r.tenant or ""] += r.prompt_tokens
    got: dict[object, float] = defaultdict(float)
    for g in groups:
        got[g["SubAccountId"] or ""] += int(g["prompt_tokens"])
    assert got == per_tenant


class Gate:
    """An input the test feeds one row at a time; the export must not wait for its end."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[UsageRow | None] = asyncio.Queue()

    async def rows(self) -> AsyncIterator[UsageRow]:
        while (item := await self.queue.get()) is not None:
            yield item


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
async def test_lines_stream_before_the_input_ends(fmt):
    gate = Gate()
    lines = export_lines(gate.rows(), fmt)
    if fmt == "csv":
        header = await asyncio.wait_for(anext(lines), 10)  # before any row exists
        assert header.startswith(b"request_id,")
    gate.queue.put_nowait(row(0))
    first = await asyncio.wait_for(anext(lines), 10)  # the input has not ended
    assert b"req_0000" in first
    gate.queue.put_nowait(row(1))
    assert b"req_0001" in await asyncio.wait_for(anext(lines), 10)
    gate.queue.put_nowait(None)
    assert [line async for line in lines] == []


async def test_grouped_output_waits_for_the_whole_input():
    gate = Gate()
    lines = export_lines(gate.rows(), "jsonl", "day")
    pending = asyncio.ensure_future(anext(lines))
    for i in range(3):
        gate.queue.put_nowait(row(i))
    await asyncio.sleep(0)
    assert not pending.done()
    gate.queue.put_nowait(None)
    assert json.loads(await asyncio.wait_for(pending, 10))["requests"] == 3


async def test_prime_reads_the_first_row_now_and_keeps_it():
    seen: list[int] = []

    async def rows() -> AsyncIterator[UsageRow]:
        for i in range(3):
            seen.append(i)
            yield row(i)

    primed = await prime(rows())
    assert seen == [0]
    assert [r.request_id async for r in primed] == ["req_0000", "req_0001", "req_0002"]
    assert [r async for r in await prime(source([]))] == []

    async def broken() -> AsyncIterator[UsageRow]:
        raise ConnectionError("ledger down")
        yield  # pragma: no cover

    with pytest.raises(ConnectionError):
        await prime(broken())


# ---------------------------------------------------------------- HTTP routes

ADMIN_KEY = "admin-secret-key"


@pytest.fixture
async def usage_app(tmp_path):
    (tmp_path / "config.yaml").write_text(
        "auth: {admin_key_env: TEST_ADMIN, keys_file: keys.json}\ntenants: {acme: {}, zeta: {}}\n"
    )
    config = load_config(tmp_path / "config.yaml")
    acme_key, _ = KeysFile(tmp_path / "keys.json").create("acme", "ci")
    auth = Authenticator(config, {"TEST_ADMIN": ADMIN_KEY}, FakeClock())
    ledger = SqliteLedger(tmp_path / "usage.db", page_rows=3)
    rows = [row(i, tenant=["acme", "zeta"][i % 2]) for i in range(10)]
    await asyncio.gather(*(ledger.append(r) for r in rows))
    app = Litestar(
        route_handlers=[admin_usage, tenant_usage],
        exception_handlers=exception_handlers(),
    )
    app.state.gateway = SimpleNamespace(ledger=ledger, runtime=SimpleNamespace(auth=auth))
    async with AsyncTestClient(app) as client:
        yield SimpleNamespace(client=client, acme_key=acme_key, rows=rows)
    await ledger.aclose()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def test_admin_reads_every_tenant_or_one(usage_app):
    client = usage_app.client
    response = await client.get("/admin/usage", headers=bearer(ADMIN_KEY))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/x-ndjson")
    ids = [json.loads(line)["request_id"] for line in response.text.splitlines()]
    assert ids == [r.request_id for r in usage_app.rows]
    response = await client.get(
        "/admin/usage",
        params={"tenant": "zeta", "format": "csv", "from": "2024-05-01T02:00:00Z"},
        headers=bearer(ADMIN_KEY),
    )
    assert response.headers["content-type"].startswith("text/csv")
    table = list(csv.reader(io.StringIO(response.text, newline="")))
    assert [r[0] for r in table[1:]] == ["req_0003", "req_0005", "req_0007", "req_0009"]


async def test_admin_route_refuses_tenant_keys_and_strangers(usage_app):
    client = usage_app.client
    assert (await client.get("/admin/usage", headers=bearer(usage_app.acme_key))).status_code == 403
    assert (await client.get("/admin/usage")).status_code == 401
    assert (await client.get("/admin/usage", headers=bearer("sk-wrong"))).status_code == 401


async def test_a_tenant_key_reads_its_own_rows_only(usage_app):
    client, key = usage_app.client, usage_app.acme_key
    response = await client.get("/v1/usage", params={"group_by": "day"}, headers=bearer(key))
    assert response.status_code == 200
    [group] = [json.loads(line) for line in response.text.splitlines()]
    assert group["SubAccountId"] == "acme" and group["requests"] == 5
    same = await client.get("/v1/usage", params={"tenant": "acme"}, headers=bearer(key))
    assert len(same.text.splitlines()) == 5
    other = await client.get("/v1/usage", params={"tenant": "zeta"}, headers=bearer(key))
    assert other.status_code == 403
    assert other.json()["error"]["type"] == "permission_error"
    assert other.json()["error"]["param"] == "tenant"


async def test_bad_filters_are_400_with_the_parameter_named(usage_app):
    response = await usage_app.client.get(
        "/v1/usage", params={"from": "last tuesday"}, headers=bearer(usage_app.acme_key)
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "from"
    response = await usage_app.client.get(
        "/admin/usage", params={"format": "xml"}, headers=bearer(ADMIN_KEY)
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "format"


# ---------------------------------------------------------------- CLI


def cli_main(argv: list[str]) -> int:
    """``switchyard usage ...`` through the parser this module adds."""
    parser = argparse.ArgumentParser(prog="switchyard")
    cli_usage.add_parser(parser.add_subparsers(dest="command", required=True))
    return cli_usage.run(parser.parse_args(argv))


async def test_cli_export_writes_the_file_atomically(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("ledger: {path: ledger/usage.db}\n")
    ledger = SqliteLedger(tmp_path / "ledger" / "usage.db")
    rows = [row(i, tenant=["acme", "zeta"][i % 2]) for i in range(30)]
    await asyncio.gather(*(ledger.append(r) for r in rows))
    await ledger.aclose()
    out = tmp_path / "out" / "may.csv"
    out.parent.mkdir()
    args = [
        "usage", "export", "--config", str(tmp_path / "config.yaml"), "--tenant", "acme",
        "--from", "2024-05-01", "--to", "2024-05-01", "--format", "csv", "--out", str(out),
    ]  # fmt: skip
    assert await asyncio.to_thread(cli_main, args) == 0
    table = list(csv.reader(io.StringIO(out.read_text(), newline="")))
    assert [r[0] for r in table[1:]] == [r.request_id for r in rows if r.tenant == "acme"][:12]
    assert sorted(p.name for p in out.parent.iterdir()) == ["may.csv"]  # no temp file left
    assert "rows read: 12" in capsys.readouterr().err
    grouped = [*args[:-2], "--group-by", "model", "--out", str(out)]
    assert await asyncio.to_thread(cli_main, grouped) == 0
    assert len(out.read_text().splitlines()) == 2


async def test_cli_reports_bad_options_and_a_missing_ledger(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("ledger: {path: nowhere.db}\n")
    base = ["usage", "export", "--config", str(tmp_path / "config.yaml"), "--out"]
    out = str(tmp_path / "x.jsonl")
    assert await asyncio.to_thread(cli_main, [*base, out]) == 1
    assert "no usage ledger" in capsys.readouterr().err
    assert not (tmp_path / "nowhere.db").exists()
    assert await asyncio.to_thread(cli_main, [*base, out, "--from", "soon"]) == 1
    assert "--from" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()
