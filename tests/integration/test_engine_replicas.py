"""Spill-over decided from each serving engine's own ``/metrics`` names, over real HTTP.

One in-process gateway, one ``type: vllm`` provider per engine kind (``engine: sglang``,
``tgi``, ...), each a fake replica at ``/<engine>/`` on one loopback server: its ``/metrics``
page is that engine's busy or idle page (tests/fixtures/engine_metrics/, the captured vLLM
pages, the JAX worker's page rendered by its own exporter), everything else the fake OpenAI
app. Each alias routes to its replica first and to a fake managed provider second.

With ``max_waiting: 0`` a busy page (requests waiting) makes the replica saturated and the
request spills to the managed provider; an idle page keeps it local.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from local_tier.engines import KINDS
from local_tier.jax.api import EngineStats
from local_tier.worker.metrics import WorkerMetrics
from tests.fixtures import fake_replica
from tests.fixtures.asgi import Scope, send_bytes
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-engines-0123456789abcdef"
PAGES = Path(__file__).resolve().parents[1] / "fixtures" / "engine_metrics"


def jax_page(running: int, waiting: int, kv: float) -> str:
    """A JAX worker's page, rendered by the worker's own exporter."""
    stats = EngineStats(
        num_requests_running=running,
        num_requests_waiting=waiting,
        kv_cache_usage_perc=kv,
        prefix_cache_queries_total=512,
        prefix_cache_hits_total=128,
        prompt_tokens_total=512,
        generation_tokens_total=64,
        block_size=16,
        num_blocks=512,
    )
    return WorkerMetrics("m-local", lambda: stats).render().decode()


def engine_pages(kind: str) -> tuple[str, str]:
    """(busy page, idle page) of engine ``kind``."""
    if kind == "vllm":
        return fake_replica.BUSY, fake_replica.IDLE
    if kind == "jax":
        return jax_page(1, 3, 0.4), jax_page(0, 0, 0.0)
    return (PAGES / f"{kind}_busy.txt").read_text(), (PAGES / f"{kind}_idle.txt").read_text()


@dataclass
class Replicas:
    """``/<kind>/metrics``: that engine's busy or idle page; ``/<kind>/v1/...``: the fake
    OpenAI app of that replica (its own, so calls are counted per engine)."""

    busy: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(KINDS, True))
    chats: dict[str, FakeOpenAI] = field(default_factory=lambda: {k: FakeOpenAI() for k in KINDS})
    pages: dict[str, tuple[str, str]] = field(
        default_factory=lambda: {k: engine_pages(k) for k in KINDS}
    )

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        _, kind, rest = scope["path"].split("/", 2)
        if rest == "metrics":
            busy, idle = self.pages[kind]
            body = (busy if self.busy[kind] else idle).encode()
            await send_bytes(send, 200, body, {"content-type": "text/plain; version=0.0.4"})
            return
        await self.chats[kind]({**scope, "path": f"/{rest}"}, receive, send)

    def calls(self, kind: str) -> int:
        requests = self.chats[kind].requests
        return sum(1 for r in requests if r.path.endswith("/chat/completions"))


@dataclass
class World:
    gateway: Gateway
    replicas: Replicas
    managed: FakeOpenAI


def config_for(replicas_url: str, managed_url: str) -> str:
    providers = "\n".join(
        f"""  local-{kind}:
    type: vllm
    engine: {kind}
    base_url: "{replicas_url}/{kind}/v1"
    saturation: {{poll_interval_s: 0.05, max_waiting: 0, stale_after_s: 2}}"""
        for kind in KINDS
    )
    models = "\n".join(
        f"  {kind}: {{targets: [{{provider: local-{kind}, model: m-local}}, "
        "{provider: managed, model: m-managed}]}"
        for kind in KINDS
    )
    return f"""
auth: {{admin_key_env: T_ADMIN}}
providers:
{providers}
  managed: {{type: openai, base_url: "{managed_url}/v1", api_key_env: T_OA}}
models:
{models}
"""


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    replicas, managed = Replicas(), FakeOpenAI()
    with serve(replicas) as local, serve(managed) as upstream:
        env = {"T_ADMIN": ADMIN, "T_OA": "sk-upstream"}
        with running_gateway(config_for(local.url, upstream.url), env) as gateway:
            yield World(gateway, replicas, managed)


def target_health(world: World, label: str) -> dict[str, Any]:
    answer = httpx.get(
        world.gateway.url + "/admin/targets",
        headers={"authorization": f"Bearer {ADMIN}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    (found,) = [t for t in answer.json()["targets"] if t["target"] == label]
    return dict(found)


def eventually(condition: Callable[[], bool], limit_s: float = 15.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def chat(world: World, alias: str) -> httpx.Response:
    body = {"model": alias, "messages": [{"role": "user", "content": "hello"}]}
    answer = httpx.post(world.gateway.base_url + "/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer


@pytest.mark.parametrize("kind", KINDS)
def test_busy_spills_over_and_idle_stays_local(world: World, kind: str) -> None:
    label = f"local-{kind}/m-local"
    world.replicas.busy[kind] = True
    eventually(lambda: (h := target_health(world, label))["saturated"] and h["waiting"] > 0)
    before = world.replicas.calls(kind)

    spilled = chat(world, kind)
    assert spilled.headers["x-switchyard-provider"] == "managed"
    assert f"skipped {label} (saturated)" in spilled.headers["x-switchyard-route-reason"]
    assert world.replicas.calls(kind) == before  # nothing reached the busy replica

    world.replicas.busy[kind] = False
    eventually(lambda: not target_health(world, label)["saturated"])
    local = chat(world, kind)
    assert local.headers["x-switchyard-provider"] == f"local-{kind}"
    assert "saturated" not in local.headers["x-switchyard-route-reason"]
    assert local.json()["choices"][0]["message"]["content"] == "Hello from openai!"
    assert world.replicas.calls(kind) == before + 1
