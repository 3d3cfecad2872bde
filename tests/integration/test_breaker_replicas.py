"""Breakers shared between gateway replicas: two gateway OS processes with the same policy
file on one real redis-server. Failures sent through replica A open the primary's breaker;
replica B picks the state up from Redis (its background refresh runs every 0.2 s) and skips
the primary without ever calling it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.processes import GatewayProcess

ADMIN = "sy-admin-replicas-0123456789"
PRIMARY, BACKUP = "m-shared-primary", "m-shared-backup"
PRIMARY_LABEL = f"oa/{PRIMARY}"
THRESHOLD = 3


@pytest.fixture
def upstream() -> Iterator[FakeOpenAI]:
    app = FakeOpenAI()
    with serve(app) as server:
        app.url = server.url  # type: ignore[attr-defined]
        yield app


@pytest.fixture
def replicas(
    upstream: FakeOpenAI, redis_url: str, tmp_path: Path
) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    up = upstream.url  # type: ignore[attr-defined]
    # A cool-down far longer than the test, so the breaker cannot drift to half-open.
    config = f"""
state: {{backend: redis, redis: {{url: "{redis_url}", key_prefix: "replicas:"}}}}
auth: {{admin_key_env: T_ADMIN}}
server: {{watch_config: false}}
routing:
  max_attempts_per_target: 1
  breaker: {{consecutive_failures: {THRESHOLD}, min_calls: {THRESHOLD}, failure_rate: 1.0,
            window_s: 60, cooldown_s: 120}}
providers:
  oa: {{type: openai, base_url: "{up}/v1", api_key_env: T_OA}}
models:
  chat: {{targets: [{{provider: oa, model: {PRIMARY}}}, {{provider: oa, model: {BACKUP}}}]}}
"""
    path = tmp_path / "policy.yaml"
    path.write_text(config)
    env = {"T_ADMIN": ADMIN, "T_OA": "sk-upstream"}
    a = GatewayProcess(path, env, tmp_path / "a.log")
    b = GatewayProcess(path, env, tmp_path / "b.log")
    try:
        a.start()
        b.start()
        yield a, b
    finally:
        a.kill()
        b.kill()


def chat(gateway: GatewayProcess) -> httpx.Response:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}
    answer = httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer


def calls(upstream: FakeOpenAI, model: str) -> int:
    return sum(1 for r in upstream.requests if (r.json or {}).get("model") == model)


def breaker(gateway: GatewayProcess, label: str) -> str:
    answer = httpx.get(
        gateway.url + "/admin/targets", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    found: list[dict[str, Any]] = [t for t in answer.json()["targets"] if t["target"] == label]
    assert len(found) == 1, answer.text
    return str(found[0]["breaker"])


def wait_for_breaker(gateway: GatewayProcess, label: str, wanted: str, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    state = breaker(gateway, label)
    while state != wanted and time.monotonic() < deadline:
        time.sleep(0.05)
        state = breaker(gateway, label)
    assert state == wanted, f"{label} on {gateway.url} stayed {state!r}"


def test_failures_through_one_replica_open_the_breaker_for_the_other(
    replicas: tuple[GatewayProcess, GatewayProcess], upstream: FakeOpenAI
) -> None:
    a, b = replicas
    assert chat(b).headers["x-switchyard-upstream-model"] == PRIMARY  # both start closed
    assert breaker(a, PRIMARY_LABEL) == breaker(b, PRIMARY_LABEL) == "closed"

    upstream.failing.add(PRIMARY)
    for _ in range(THRESHOLD):
        assert chat(a).headers["x-switchyard-upstream-model"] == BACKUP
    assert breaker(a, PRIMARY_LABEL) == "open"
    primary = calls(upstream, PRIMARY)
    assert primary == 1 + THRESHOLD  # B's first request and A's failures, nothing from B

    # B has served no failure itself: only the shared state in Redis can open it there.
    wait_for_breaker(b, PRIMARY_LABEL, "open", limit_s=5.0)
    for _ in range(3):
        answer = chat(b)
        assert answer.headers["x-switchyard-upstream-model"] == BACKUP
        reason = answer.headers["x-switchyard-route-reason"]
        assert f"skipped {PRIMARY_LABEL} (circuit open)" in reason, reason
    assert calls(upstream, PRIMARY) == primary  # B never called the primary

    # Healthy again upstream, but the breaker (shared, cooling down) still holds it out.
    upstream.failing.discard(PRIMARY)
    assert chat(a).headers["x-switchyard-upstream-model"] == BACKUP
    assert chat(b).headers["x-switchyard-upstream-model"] == BACKUP
    assert calls(upstream, PRIMARY) == primary
