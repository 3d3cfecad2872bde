"""The control plane across three real ``switchyard serve`` processes sharing PostgreSQL (the
control store: a fresh database on the machine's server) and a real Redis (quotas and the
rest of the shared state):

- a key created through replica A works on B and C within about a second;
- a key rotated through B works with both secrets on every replica during the grace period,
  and only with the new one everywhere after it;
- a key revoked through C fails on every replica within about a second;
- a tenant created through A (and a key of it) is served by B and C;
- 1,000 concurrent requests spread over the three leave exactly 1,000 rows in the shared
  Postgres ledger, with token sums equal to what the upstream reported.

Propagation is polled with a deadline of a few seconds (the replicas poll the store every
250 ms); the measured delays are printed, never asserted tightly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import httpx
import psycopg
import pytest

from policies.ledger.postgres_schema import TABLE
from tests.fixtures.fake_openai import FakeOpenAI, usage_for
from tests.fixtures.postgres_server import scratch_database, shared_postgres  # noqa: F401
from tests.fixtures.redis_server import RedisServer
from tests.fixtures.server import serve
from tests.integration.processes import GatewayProcess

pytestmark = pytest.mark.hostile
ADMIN = "sy-admin-replicas-0123456789"
DEADLINE_S = 5.0  # generous next to the ~0.25 s poll: a loaded CI machine is slow
GRACE_S = 3.0


@dataclass
class Fleet:
    gateways: list[GatewayProcess]
    upstream: FakeOpenAI
    dsn: str  # the control store's and the ledger's database


@pytest.fixture(scope="module")
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    tmp_path = tmp_path_factory.mktemp("control-replicas")
    admin_dsn = request.getfixturevalue("shared_postgres")  # fails under CI if unreachable
    redis_server: RedisServer = request.getfixturevalue("redis_server")
    redis_url = redis_server.start().url
    with ExitStack() as stack:
        pg_dsn = stack.enter_context(scratch_database(admin_dsn))
        fake = FakeOpenAI()
        upstream = stack.enter_context(serve(fake))
        config = tmp_path / "policy.yaml"
        config.write_text(f"""
auth: {{admin_key_env: T_ADMIN}}
control: {{backend: postgres, dsn_env: T_CONTROL_DSN}}
ledger: {{backend: postgres, dsn_env: T_CONTROL_DSN, spool_path: {tmp_path / "spool.sqlite3"}}}
state: {{backend: redis, redis: {{url: "{redis_url}"}}}}
tenants: {{acme: {{limits: {{rpm: 10000}}}}}}
providers: {{oa: {{type: openai, base_url: "{upstream.url}/v1", api_key_env: T_OA}}}}
models:
  chat: {{targets: [{{provider: oa, model: m-ok}}]}}
  bulk: {{targets: [{{provider: oa, model: m-count}}]}}
server: {{watch_config: false}}
logging: {{level: warning}}
""")
        env = {"T_ADMIN": ADMIN, "T_OA": "sk-upstream", "T_CONTROL_DSN": pg_dsn}
        gateways = []
        for name in "abc":
            gateway = GatewayProcess(config, env, tmp_path / f"{name}.log")
            stack.callback(gateway.kill)
            gateways.append(gateway.start())
        yield Fleet(gateways, fake, pg_dsn)


@pytest.fixture(scope="module")
def replicas(fleet: Fleet) -> list[GatewayProcess]:
    return fleet.gateways


def admin(gateway: GatewayProcess, method: str, path: str, body: object = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {ADMIN}"}
    return httpx.request(method, gateway.url + path, json=body, headers=headers, timeout=10)


def status(gateway: GatewayProcess, key: str) -> int:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {key}"}
    answer = httpx.post(gateway.base_url + "/chat/completions", json=body, headers=headers)
    return answer.status_code


def seconds_until(gateways: list[GatewayProcess], key: str, wanted: int) -> float | None:
    """How long until every gateway answers ``key`` with ``wanted`` (None: not within the
    deadline). Each gateway is polled until it does; the slowest counts."""
    started = time.monotonic()
    pending = list(gateways)
    while pending and time.monotonic() - started < DEADLINE_S:
        pending = [g for g in pending if status(g, key) != wanted]
        if pending:
            time.sleep(0.02)
    return None if pending else time.monotonic() - started


def test_keys_changed_through_one_replica_are_enforced_by_all(
    replicas: list[GatewayProcess],
) -> None:
    a, b, c = replicas
    created = admin(a, "POST", "/admin/keys", {"tenant": "acme", "name": "fleet"})
    assert created.status_code == 201, created.text
    key, key_id = created.json()["key"], created.json()["id"]
    assert status(a, key) == 200  # the replica that made the change: at once
    spread = seconds_until([b, c], key, 200)
    assert spread is not None, "a new key did not reach B and C"

    rotated = admin(b, "POST", f"/admin/keys/{key_id}/rotate", {"grace_seconds": GRACE_S})
    assert rotated.status_code == 200, rotated.text
    new_key = rotated.json()["key"]
    rotated_at = time.monotonic()
    assert seconds_until(replicas, new_key, 200) is not None
    in_grace = [status(g, key) for g in replicas]
    checked_within_grace = time.monotonic() - rotated_at < GRACE_S
    assert not checked_within_grace or in_grace == [200, 200, 200]
    time.sleep(max(0.0, GRACE_S - (time.monotonic() - rotated_at)))
    assert seconds_until(replicas, key, 401) is not None, "the old secret outlived its grace"
    assert [status(g, new_key) for g in replicas] == [200, 200, 200]

    revoked = admin(c, "POST", f"/admin/keys/{key_id}/revoke")
    assert revoked.status_code == 200, revoked.text
    gone = seconds_until(replicas, new_key, 401)
    assert gone is not None, "a revoked key kept working somewhere"
    print(f"\npropagation: new key to B and C {spread:.3f} s; revocation {gone:.3f} s")


def test_tenants_created_through_one_replica_are_served_by_all(
    replicas: list[GatewayProcess],
) -> None:
    a, b, c = replicas
    created = admin(a, "POST", "/admin/tenants", {"name": "newco", "limits": {"rpm": 1000}})
    assert created.status_code == 201, created.text
    answer = admin(a, "POST", "/admin/keys", {"tenant": "newco"})
    assert answer.status_code == 201, answer.text
    assert seconds_until([b, c], answer.json()["key"], 200) is not None
    listed = admin(c, "GET", "/admin/tenants").json()["data"]
    assert {t["id"]: t["source"] for t in listed} == {"acme": "config", "newco": "api"}


BULK = 1000


def test_concurrent_requests_over_the_replicas_leave_one_postgres_row_each(fleet: Fleet) -> None:
    answers = asyncio.run(_bulk(fleet.gateways))
    assert answers == [200] * BULK
    sent = [r.json for r in list(fleet.upstream.requests) if "bulk-" in str(r.json)]
    assert len(sent) == BULK  # each request reached the upstream once
    expected = [usage_for(body or {}) for body in sent]
    rows = _ledger_rows(fleet.dsn)
    assert len(rows) == BULK and len({row[0] for row in rows}) == BULK
    assert sum(row[1] for row in rows) == sum(u["prompt_tokens"] for u in expected)
    assert sum(row[2] for row in rows) == sum(u["completion_tokens"] for u in expected)


async def _bulk(gateways: list[GatewayProcess]) -> list[int]:
    """``BULK`` requests, round-robin over the replicas, at most 100 in flight."""
    limit = asyncio.Semaphore(100)
    headers = {"authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient(timeout=60, headers=headers) as client:

        async def one(i: int) -> int:
            gateway = gateways[i % len(gateways)]
            content = f"bulk-{i} " + "x" * (i % 37)  # token counts differ per request
            body = {"model": "bulk", "messages": [{"role": "user", "content": content}]}
            async with limit:
                answer = await client.post(
                    gateway.base_url + "/chat/completions",
                    json=body,
                    headers={"x-request-id": f"bulk-{i}"},
                )
            return answer.status_code

        return list(await asyncio.gather(*(one(i) for i in range(BULK))))


def _ledger_rows(dsn: str) -> list[tuple[str, int, int]]:
    """(request_id, prompt, completion tokens) of the bulk requests' rows; waits up to a
    few seconds for the last group commits."""
    query = (
        f"SELECT request_id, prompt_tokens, completion_tokens FROM {TABLE}"
        " WHERE client_request_id LIKE 'bulk-%'"
    )
    deadline = time.monotonic() + DEADLINE_S
    while True:
        with psycopg.connect(dsn) as conn:
            rows = [(str(a), int(b), int(c)) for a, b, c in conn.execute(query).fetchall()]
        if len(rows) >= BULK or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)
