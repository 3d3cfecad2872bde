"""One real gateway process in front of a fake OpenAI upstream, with tenants, on the memory
or the Redis store, and the invariants every hostile test checks afterwards:

- every admitted request has exactly one ledger row (matched by the client's
  ``x-request-id``, which the ledger stores as ``client_request_id``);
- every concurrency lease is back and the token counter holds exactly the tokens of the
  rows (``GET /admin/tenants/{t}/quota``: reservations were settled, none leaked);
- the tenant is not locked out.

Quota counters live in fixed UTC minutes; tests that compare counters with rows run inside
one minute (``inside_one_minute``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from policies.auth import KeysFile
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.fake_replica import Replica
from tests.fixtures.server import serve
from tests.integration.processes import GatewayProcess

ADMIN = "sk-admin-hostile"
ROWS_TIMEOUT_S = 20.0


@dataclass
class World:
    gateway: GatewayProcess
    upstream: FakeOpenAI
    keys: dict[str, str]  # tenant -> API key
    backend: str
    folder: Path
    extra: dict[str, Any] = field(default_factory=dict)

    def auth(self, tenant: str, **headers: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.keys[tenant]}", **headers}

    def admin_get(self, path: str, **params: str) -> httpx.Response:
        return httpx.get(
            self.gateway.url + path,
            params=params,
            headers={"authorization": f"Bearer {ADMIN}"},
            timeout=30.0,
        )

    def rows(self, tenant: str | None = None) -> list[dict[str, Any]]:
        """Every ledger row (of ``tenant``), as the admin export gives them."""
        params = {"tenant": tenant} if tenant else {}
        answer = self.admin_get("/admin/usage", **params)
        assert answer.status_code == 200, answer.text
        return [json.loads(line) for line in answer.text.splitlines() if line]

    def rows_when(self, tenant: str, count: int) -> list[dict[str, Any]]:
        """The tenant's rows once there are at least ``count`` (rows of requests that were
        cancelled are committed by their own task and may lag a little), or as they are
        after ``ROWS_TIMEOUT_S``."""
        deadline = time.monotonic() + ROWS_TIMEOUT_S
        while True:
            rows = self.rows(tenant)
            if len(rows) >= count or time.monotonic() > deadline:
                return rows
            time.sleep(0.2)

    def quota(self, tenant: str) -> dict[str, float]:
        """metric -> current use of the tenant's own limits."""
        answer = self.admin_get(f"/admin/tenants/{tenant}/quota")
        assert answer.status_code == 200, answer.text
        return {
            entry["metric"]: entry["used"]
            for entry in answer.json()["limits"]
            if entry["scope"] == "tenant"
        }

    def settled(self, tenant: str, timeout_s: float = ROWS_TIMEOUT_S) -> dict[str, float]:
        """The tenant's quota use once no lease is held (or as it is after the timeout)."""
        deadline = time.monotonic() + timeout_s
        while True:
            used = self.quota(tenant)
            if used.get("concurrency", 0) == 0 or time.monotonic() > deadline:
                return used
            time.sleep(0.2)

    def queue_depth(self) -> int:
        answer = self.admin_get("/admin/targets")
        assert answer.status_code == 200, answer.text
        return int(answer.json()["queue"]["depth"])

    def log(self) -> str:
        return self.gateway.log_path.read_text()[-4000:]


def config_text(
    world_dir: Path,
    upstream_url: str,
    replica_url: str,
    backend: str,
    redis_url: str | None,
    tenants: str,
    extra: str = "",
    redis_timeout_s: float = 2.0,
) -> str:
    redis = f'url: "{redis_url}", key_prefix: "hostile:", timeout_s: {redis_timeout_s}'
    state = (
        f"state: {{backend: redis, redis: {{{redis}}}}}"
        if backend == "redis"
        else "state: {backend: memory}"
    )
    return f"""
server: {{watch_config: false}}
logging: {{level: info}}
{state}
auth: {{admin_key_env: H_ADMIN, keys_file: {world_dir / "keys.json"}}}
tenants:
{tenants}
ledger: {{path: {world_dir / "usage.sqlite3"}, spool_path: {world_dir / "spool.sqlite3"}}}
providers:
  oa: {{type: openai, base_url: "{upstream_url}/v1", api_key_env: H_OA, first_token_timeout_s: 30}}
  replica:
    type: vllm
    base_url: "{replica_url}/v1"
    saturation: {{poll_interval_s: 0.05, max_waiting: 0, stale_after_s: 5}}
models:
  queued: {{queue_deadline_s: 30, targets: [{{provider: replica, model: m-local}}]}}
  count: {{targets: [{{provider: oa, model: m-count}}]}}
  slow: {{targets: [{{provider: oa, model: m-slow}}]}}
  slowstream: {{targets: [{{provider: oa, model: m-slow-stream}}]}}
  fallback: {{targets: [{{provider: oa, model: m-server-error}}, {{provider: oa, model: m-slow}}]}}
{extra}
"""


@contextmanager
def hostile_world(
    folder: Path,
    backend: str,
    redis_url: str | None,
    tenants: dict[str, str],
    extra: str = "",
    slow_seconds: float = 5.0,
    redis_timeout_s: float = 2.0,
) -> Iterator[World]:
    """A gateway process serving ``tenants`` (name -> YAML flow mapping of its settings),
    each with one API key, on ``backend``; the fake upstream's slow models take
    ``slow_seconds``. Redis commands time out after ``redis_timeout_s`` (generous by
    default: on a loaded machine the product's 0.25 s reads as an outage)."""
    keys_file = KeysFile(folder / "keys.json")
    keys = {name: keys_file.create(name, "hostile")[0] for name in tenants}
    upstream = FakeOpenAI()
    upstream.slow_seconds = slow_seconds
    replica = Replica()  # saturated: requests for ``queued`` wait in the admission queue
    tenant_lines = "\n".join(f"  {name}: {spec}" for name, spec in tenants.items())
    with ExitStack() as stack:
        up = stack.enter_context(serve(upstream))
        local = stack.enter_context(serve(replica))
        path = folder / "gateway.yaml"
        text = config_text(
            folder, up.url, local.url, backend, redis_url, tenant_lines, extra, redis_timeout_s
        )
        path.write_text(text)
        env = {"H_ADMIN": ADMIN, "H_OA": "sk-upstream"}
        gateway = GatewayProcess(path, env, folder / "gateway.log")
        stack.callback(gateway.kill)
        gateway.start()
        yield World(gateway, upstream, keys, backend, folder, {"replica": replica})


def inside_one_minute(needed_s: float) -> None:
    """Wait, if need be, until at least ``needed_s`` of the current UTC minute are left."""
    left = 60 - time.time() % 60
    if left < needed_s:
        time.sleep(left + 0.5)


def tokens_of(rows: list[dict[str, Any]]) -> int:
    return sum(int(r["prompt_tokens"]) + int(r["completion_tokens"]) for r in rows)
