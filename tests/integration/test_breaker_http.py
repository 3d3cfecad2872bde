"""The circuit breaker over real HTTP: an in-process gateway in front of a fake OpenAI
upstream whose primary model can be switched to answer 500.

One scenario, in order: failures fall back to the backup; after ``consecutive_failures`` the
primary's breaker is open and requests go straight to the backup without calling it (the
route reason says "circuit open", ``GET /admin/targets`` says "open"); after the cool-down a
probe goes to the primary and, while it still fails, reopens the breaker; once the primary
is healthy a probe succeeds, the breaker closes and the primary serves again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-breaker-0123456789"
PRIMARY, BACKUP = "m-breaker-primary", "m-breaker-backup"
PRIMARY_LABEL = f"oa/{PRIMARY}"
COOLDOWN_S = 1.0
THRESHOLD = 3


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAI]:
    app = FakeOpenAI()
    with serve(app) as server:
        app.url = server.url  # type: ignore[attr-defined]
        yield app


@pytest.fixture(scope="module")
def gateway(upstream: FakeOpenAI) -> Iterator[Gateway]:
    up = upstream.url  # type: ignore[attr-defined]
    # One attempt per target, so every failed request costs the primary exactly one call;
    # failure_rate 1.0 keeps the consecutive-failures rule the one that trips.
    config = f"""
auth: {{admin_key_env: T_ADMIN}}
routing:
  max_attempts_per_target: 1
  breaker: {{consecutive_failures: {THRESHOLD}, min_calls: {THRESHOLD}, failure_rate: 1.0,
            window_s: 60, cooldown_s: {COOLDOWN_S}, half_open_probes: 1}}
providers:
  oa: {{type: openai, base_url: "{up}/v1", api_key_env: T_OA}}
models:
  chat: {{targets: [{{provider: oa, model: {PRIMARY}}}, {{provider: oa, model: {BACKUP}}}]}}
"""
    with running_gateway(config, {"T_ADMIN": ADMIN, "T_OA": "sk-upstream"}) as gw:
        yield gw


def chat(gateway: Gateway) -> httpx.Response:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}
    answer = httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer


def calls(upstream: FakeOpenAI, model: str) -> int:
    return sum(1 for r in upstream.requests if (r.json or {}).get("model") == model)


def target(gateway: Gateway, label: str) -> dict[str, Any]:
    answer = httpx.get(
        gateway.url + "/admin/targets", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    found = [t for t in answer.json()["targets"] if t["target"] == label]
    assert len(found) == 1, answer.text
    return found[0]


def wait_for_state(gateway: Gateway, label: str, wanted: str, limit_s: float) -> None:
    """Poll ``GET /admin/targets`` until ``label``'s breaker reads ``wanted``."""
    deadline = time.monotonic() + limit_s
    state = target(gateway, label)["breaker"]
    while state != wanted and time.monotonic() < deadline:
        time.sleep(0.05)
        state = target(gateway, label)["breaker"]
    assert state == wanted, f"{label} stayed {state!r}, expected {wanted!r}"


def served_by(answer: httpx.Response) -> str:
    return answer.headers["x-switchyard-upstream-model"]


def test_breaker_opens_skips_probes_and_closes(gateway: Gateway, upstream: FakeOpenAI) -> None:
    first = chat(gateway)
    assert served_by(first) == PRIMARY
    assert target(gateway, PRIMARY_LABEL)["breaker"] == "closed"

    upstream.failing.add(PRIMARY)
    try:
        _failures_fall_back_until_open(gateway, upstream)
        _open_breaker_skips_the_primary(gateway, upstream)
        _probe_while_failing_reopens(gateway, upstream)
    finally:
        upstream.failing.discard(PRIMARY)
    _probe_after_recovery_closes(gateway, upstream)


def _failures_fall_back_until_open(gateway: Gateway, upstream: FakeOpenAI) -> None:
    before = calls(upstream, PRIMARY)
    for _ in range(THRESHOLD):
        answer = chat(gateway)
        assert served_by(answer) == BACKUP
        reason = answer.headers["x-switchyard-route-reason"]
        assert f"fallback after {PRIMARY_LABEL} failed" in reason
        assert answer.json()["choices"][0]["message"]["content"] == "Hello from openai!"
    assert calls(upstream, PRIMARY) == before + THRESHOLD
    assert target(gateway, PRIMARY_LABEL)["breaker"] == "open"


def _open_breaker_skips_the_primary(gateway: Gateway, upstream: FakeOpenAI) -> None:
    primary, backup = calls(upstream, PRIMARY), calls(upstream, BACKUP)
    for _ in range(3):
        answer = chat(gateway)
        assert served_by(answer) == BACKUP
        reason = answer.headers["x-switchyard-route-reason"]
        assert f"skipped {PRIMARY_LABEL} (circuit open)" in reason, reason
        assert "failed" not in reason  # it was not called, so it cannot have failed
        assert answer.headers["x-switchyard-attempts"] == "1"
    assert calls(upstream, PRIMARY) == primary  # never called while open
    assert calls(upstream, BACKUP) == backup + 3


def _probe_while_failing_reopens(gateway: Gateway, upstream: FakeOpenAI) -> None:
    wait_for_state(gateway, PRIMARY_LABEL, "half_open", COOLDOWN_S + 5)
    primary = calls(upstream, PRIMARY)
    probe = chat(gateway)
    assert served_by(probe) == BACKUP
    assert f"fallback after {PRIMARY_LABEL} failed" in probe.headers["x-switchyard-route-reason"]
    assert calls(upstream, PRIMARY) == primary + 1  # exactly one probe
    assert target(gateway, PRIMARY_LABEL)["breaker"] == "open"  # a fresh cool-down
    after = chat(gateway)
    assert "circuit open" in after.headers["x-switchyard-route-reason"]
    assert calls(upstream, PRIMARY) == primary + 1


def _probe_after_recovery_closes(gateway: Gateway, upstream: FakeOpenAI) -> None:
    # Healthy again, but the breaker still holds the primary out until its cool-down ends.
    assert target(gateway, PRIMARY_LABEL)["breaker"] == "open"
    wait_for_state(gateway, PRIMARY_LABEL, "half_open", COOLDOWN_S + 5)
    primary, backup = calls(upstream, PRIMARY), calls(upstream, BACKUP)
    probe = chat(gateway)
    assert served_by(probe) == PRIMARY
    assert target(gateway, PRIMARY_LABEL)["breaker"] == "closed"
    for _ in range(2):
        answer = chat(gateway)
        assert served_by(answer) == PRIMARY
        assert "circuit open" not in answer.headers["x-switchyard-route-reason"]
    assert calls(upstream, PRIMARY) == primary + 3
    assert calls(upstream, BACKUP) == backup
