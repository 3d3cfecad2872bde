"""Spill-over from the local tier to a managed API, with a real JAX worker process serving
SmolLM2-135M with a batch of one sequence.

The gateway polls the worker's ``/metrics`` every 50 ms; once the worker reports a request
waiting (``max_waiting: 0``) it counts as saturated, and the alias's next target, a fake
managed provider, takes the requests instead of them queueing on the worker. When the burst
has drained, requests go to the worker again.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from local_tier.vllm.process import WorkerProcess
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import free_port, serve
from tests.integration.gateway_harness import Gateway, running_gateway

pytestmark = [pytest.mark.model, pytest.mark.timeout(900)]

ADMIN = "sy-admin-spill-0123456789abcdef"
MODEL = "smollm2-spill"
LOCAL_LABEL = f"local/{MODEL}"
STORY = "Write a long story about a dragon who learns to bake bread."


@pytest.fixture(scope="module")
def worker_url() -> Iterator[str]:
    """A JAX worker with one batch slot (the compile cache in ~/.cache/switchyard/jax is
    reused across runs, as by the other model tests)."""
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "local_tier.worker",
        "--port",
        str(port),
        "--served-model-name",
        MODEL,
        "--max-model-len",
        "512",
        "--max-batch-size",
        "1",
        "--kv-cache-tokens",
        "8192",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        worker = WorkerProcess(args, port=port, log_path=Path(tmp) / "worker.log").start()
        try:
            worker.wait_healthy(timeout=600)
            yield worker.base_url
        finally:
            worker.stop()


@pytest.fixture(scope="module")
def managed() -> Iterator[FakeOpenAI]:
    app = FakeOpenAI()
    with serve(app) as server:
        app.url = server.url  # type: ignore[attr-defined]
        yield app


@pytest.fixture(scope="module")
def gateway(worker_url: str, managed: FakeOpenAI) -> Iterator[Gateway]:
    up = managed.url  # type: ignore[attr-defined]
    config = f"""
auth: {{admin_key_env: T_ADMIN}}
providers:
  local:
    type: vllm
    base_url: "{worker_url}/v1"
    timeout_s: 300
    first_token_timeout_s: 300
    saturation: {{poll_interval_s: 0.05, max_waiting: 0, stale_after_s: 2}}
  managed: {{type: openai, base_url: "{up}/v1", api_key_env: T_OA}}
models:
  chat: {{targets: [{{provider: local, model: {MODEL}}}, {{provider: managed, model: m-managed}}]}}
"""
    with running_gateway(config, {"T_ADMIN": ADMIN, "T_OA": "sk-upstream"}) as gw:
        yield gw


def ask(gateway: Gateway, max_tokens: int = 64) -> httpx.Response:
    body = {
        "model": "chat",
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": STORY}],
    }
    answer = httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    return answer


def local_health(gateway: Gateway) -> dict[str, Any]:
    answer = httpx.get(
        gateway.url + "/admin/targets", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    (found,) = [t for t in answer.json()["targets"] if t["target"] == LOCAL_LABEL]
    return dict(found)


def wait_until_free(gateway: Gateway, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while local_health(gateway)["saturated"]:
        assert time.monotonic() < deadline, f"still saturated: {local_health(gateway)}"
        time.sleep(0.05)


def test_a_burst_spills_over_to_the_managed_provider_and_comes_back(
    gateway: Gateway, managed: FakeOpenAI
) -> None:
    wait_until_free(gateway, limit_s=30)
    warm = ask(gateway)  # also compiles the worker's shapes before the burst
    assert warm.headers["x-switchyard-provider"] == "local"
    wait_until_free(gateway, limit_s=60)

    burst = 6
    with ThreadPoolExecutor(max_workers=burst) as pool:
        futures = []
        for _ in range(burst):
            futures.append(pool.submit(ask, gateway))
            time.sleep(0.15)  # a few metric polls apart, so the worker's queue shows
        answers = [f.result(timeout=600) for f in futures]

    providers = [a.headers["x-switchyard-provider"] for a in answers]
    assert "local" in providers and "managed" in providers, providers
    assert providers[0] == "local"  # the worker was free when the burst began
    for answer in answers:
        reason = answer.headers["x-switchyard-route-reason"]
        if answer.headers["x-switchyard-provider"] == "managed":
            assert f"skipped {LOCAL_LABEL} (saturated)" in reason, reason
            assert answer.json()["choices"][0]["message"]["content"] == "Hello from openai!"
            assert "x-switchyard-queue-ms" not in answer.headers  # spilled, never queued
        else:
            assert answer.json()["choices"][0]["message"]["content"]
    spilled = sum(1 for r in managed.requests if (r.json or {}).get("model") == "m-managed")
    assert spilled == providers.count("managed")

    wait_until_free(gateway, limit_s=60)
    after = ask(gateway, max_tokens=8)
    assert after.headers["x-switchyard-provider"] == "local"
    assert "saturated" not in after.headers["x-switchyard-route-reason"]
