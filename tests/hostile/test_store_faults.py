"""Store faults under load (issue 10's suite): the shared Redis freezes mid-load (SIGSTOP:
commands time out, the data survives, as in a hung or partitioned Redis) and comes back.

Tenants fail open (served on local limits) or closed (503 while Redis is unreachable).
Invariants: the configured mode holds, nothing answers 500, every served request has
exactly one ledger row and a refused one none, and every concurrency lease in the shared
store is released once Redis answers again (also those whose settle fell in the outage).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fixtures.redis_server import RedisServer
from tests.hostile.harness import World, hostile_world

pytestmark = [pytest.mark.hostile, pytest.mark.anyio]

LOAD_S = 6.0
FREEZE_AT_S, THAW_AT_S = 1.5, 3.5
WORKERS = 6  # per tenant


@pytest.fixture
def world(tmp_path: Path, redis_server: RedisServer, redis_url: str) -> Iterator[World]:
    tenants = {
        "loose": "{limits: {rpm: 100000, concurrency: 100}, on_store_failure: open}",
        "strict": "{limits: {rpm: 100000, concurrency: 100}, on_store_failure: closed}",
    }
    with hostile_world(
        tmp_path, "redis", redis_url, tenants, slow_seconds=1.0, redis_timeout_s=0.25
    ) as world:
        world.extra["redis"] = redis_server
        yield world


async def worker(
    client: httpx.AsyncClient, world: World, tenant: str, index: int, until: float
) -> list[tuple[int, str]]:
    """Requests one after another until ``until``: (status, gateway request id) each."""
    out = []
    n = 0
    while time.monotonic() < until:
        model = "slow" if (index + n) % 3 == 0 else "count"
        n += 1
        body = {"model": model, "messages": [{"role": "user", "content": f"{tenant} {n}"}]}
        answer = await client.post("/v1/chat/completions", json=body, headers=world.auth(tenant))
        out.append((answer.status_code, answer.headers.get("x-switchyard-request-id", "")))
    return out


async def freeze_redis(redis: RedisServer) -> None:
    """SIGSTOP the Redis process this test session started, then SIGCONT it."""
    assert redis.proc is not None
    pid = redis.proc.pid
    await asyncio.sleep(FREEZE_AT_S)
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(THAW_AT_S - FREEZE_AT_S)
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_redis_freeze_keeps_modes_rows_and_leases(world: World) -> None:
    until = time.monotonic() + LOAD_S
    async with httpx.AsyncClient(base_url=world.gateway.url, timeout=30.0) as client:
        loads = [
            worker(client, world, tenant, i, until)
            for tenant in ("loose", "strict")
            for i in range(WORKERS)
        ]
        results = await asyncio.gather(freeze_redis(world.extra["redis"]), *loads)
    loose = [r for batch in results[1 : 1 + WORKERS] for r in batch]
    strict = [r for batch in results[1 + WORKERS :] for r in batch]

    assert Counter(s for s, _ in loose) == {200: len(loose)}, world.log()
    strict_statuses = Counter(s for s, _ in strict)
    assert set(strict_statuses) == {200, 503}, strict_statuses  # refused during the outage
    assert strict[-1][0] == 200  # and served again after it

    for tenant, answers in (("loose", loose), ("strict", strict)):
        served = {rid for status, rid in answers if status == 200}
        rows = world.rows_when(tenant, len(served))
        ids = Counter(r["request_id"] for r in rows)
        assert set(ids) == served, (len(set(ids) ^ served), world.log())
        assert max(ids.values()) == 1
        used = world.settled(tenant)
        assert used["concurrency"] == 0, (tenant, used, world.log())
