"""Client-chosen request ids are never an accounting identity (issue 10, defect 2).

A tenant that sends the same ``x-request-id`` on every request, one that reuses another
tenant's ids, and clients that send empty or hostile ids: on both store backends, the
concurrency limit holds, every served request has its own ledger row (keyed by the
gateway's id, with the client's id beside it), and the client's id is still echoed back
when it is a sane token.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.hostile.harness import World, hostile_world

pytestmark = [pytest.mark.hostile, pytest.mark.anyio]

HOSTILE_IDS: list[str | bytes] = [
    "",
    "x" * 129,  # longer than the 128 characters a sane id may have
    "../../etc/passwd",
    "id'; DROP TABLE usage;--",
    "ünïcode".encode(),  # raw UTF-8 bytes on the wire
    "a b",
    "%00",
    "*",
]


@pytest.fixture(params=["memory", "redis"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    tenants = {
        "acme": "{limits: {rpm: 100000, concurrency: 2}}",
        "globex": "{limits: {rpm: 100000}}",
    }
    with hostile_world(tmp_path, request.param, redis_url, tenants, slow_seconds=1.5) as world:
        yield world


async def chat(
    client: httpx.AsyncClient,
    world: World,
    tenant: str,
    request_id: str | bytes,
    model: str = "count",
) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    headers: dict[str, str | bytes] = {**world.auth(tenant), "x-request-id": request_id}
    return await client.post("/v1/chat/completions", json=body, headers=headers)


async def test_one_reused_id_does_not_beat_the_concurrency_limit(world: World) -> None:
    async with httpx.AsyncClient(base_url=world.gateway.url, timeout=30.0) as client:
        answers = await asyncio.gather(
            *(chat(client, world, "acme", "same", "slow") for _ in range(8))
        )
    statuses = Counter(a.status_code for a in answers)
    assert statuses == {200: 2, 429: 6}, statuses
    assert all(a.headers["x-request-id"] == "same" for a in answers)
    gateway_ids = {a.headers["x-switchyard-request-id"] for a in answers}
    assert len(gateway_ids) == 8

    rows = world.rows_when("acme", 2)
    assert len(rows) == 2  # the 429s were never admitted: no row
    assert {r["client_request_id"] for r in rows} == {"same"}
    served = {a.headers["x-switchyard-request-id"] for a in answers if a.status_code == 200}
    assert {r["request_id"] for r in rows} == served
    assert world.settled("acme")["concurrency"] == 0


async def test_reused_ids_leave_one_row_per_served_request(world: World) -> None:
    async with httpx.AsyncClient(base_url=world.gateway.url, timeout=30.0) as client:
        for _ in range(5):
            assert (await chat(client, world, "globex", "dup")).status_code == 200
        # Another tenant "pre-claims" ids and then uses the victim's: both keep their rows.
        for tenant in ("acme", "globex"):
            assert (await chat(client, world, tenant, "victim-1")).status_code == 200
    globex = world.rows_when("globex", 6)
    assert Counter(r["client_request_id"] for r in globex) == {"dup": 5, "victim-1": 1}
    acme = world.rows_when("acme", 1)
    assert [r["client_request_id"] for r in acme] == ["victim-1"]
    assert len({r["request_id"] for r in globex + acme}) == 7


async def test_empty_and_hostile_ids_are_ignored_not_echoed(world: World) -> None:
    async with httpx.AsyncClient(base_url=world.gateway.url, timeout=30.0) as client:
        answers = [await chat(client, world, "globex", rid) for rid in HOSTILE_IDS]
    for rid, answer in zip(HOSTILE_IDS, answers, strict=True):
        assert answer.status_code == 200, (rid, answer.text)
        echoed = answer.headers["x-request-id"]
        assert echoed == answer.headers["x-switchyard-request-id"]
        assert echoed.startswith("req_") and echoed != rid
    rows = world.rows_when("globex", len(HOSTILE_IDS))
    assert len(rows) == len(HOSTILE_IDS)
    assert {r["client_request_id"] for r in rows} == {None}
