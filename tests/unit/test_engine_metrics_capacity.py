"""CapacityMonitor reading replicas of several engines, each through its own mapping, from a
real HTTP server on 127.0.0.1 serving the engine pages of tests/fixtures/engine_metrics/.
Time is a FakeClock; polls are driven by ``poll_once()``."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.clock import FakeClock
from core.config import VllmProviderConfig
from core.config_routing import SaturationConfig
from local_tier.capacity import CapacityMonitor
from local_tier.engines import EngineKind
from local_tier.prefix_index import PrefixIndex
from local_tier.replicas import ReplicaSpec
from tests.fixtures.server import ServerThread

pytestmark = pytest.mark.anyio

PAGES = Path(__file__).resolve().parents[1] / "fixtures" / "engine_metrics"


def page(name: str) -> str:
    return (PAGES / f"{name}.txt").read_text()


@dataclass
class Pages:
    """``GET /<replica>/metrics`` answers ``texts[replica]``."""

    texts: dict[str, str] = field(default_factory=dict)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = self.texts[scope["path"].split("/")[1]].encode()
        headers = [(b"content-type", b"text/plain; version=0.0.4")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Pages, str]]:
    app = Pages()
    server = ServerThread(app).start()
    try:
        yield app, server.url
    finally:
        server.stop()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False) as http:
        yield http


def watch(
    served: tuple[Pages, str], client: httpx.AsyncClient, clock: FakeClock, **engines: EngineKind
) -> CapacityMonitor:
    """A monitor of one replica per ``label=engine``, each at ``/<label>/metrics``."""
    _, url = served
    specs = {
        label: ReplicaSpec(f"{url}/{label}/metrics", SaturationConfig(), engine=engine)
        for label, engine in engines.items()
    }
    index = PrefixIndex(1, clock, block_chars=64)
    return CapacityMonitor(specs, client, clock, prefix_index=index, poll_timeout_s=5.0)


def test_the_provider_config_names_the_engine() -> None:
    config = VllmProviderConfig(base_url="http://h:8080/v1", engine="llamacpp")
    assert ReplicaSpec.from_provider(config).engine == "llamacpp"
    assert ReplicaSpec.from_provider(VllmProviderConfig()).engine == "vllm"


async def test_replicas_of_different_engines_in_one_monitor(
    served: tuple[Pages, str], client: httpx.AsyncClient
) -> None:
    pages, _ = served
    pages.texts.update(sg=page("sglang_busy"), tgi=page("tgi_fresh"), trt=page("trtllm_idle"))
    monitor = watch(served, client, FakeClock(), sg="sglang", tgi="tgi", trt="trtllm")
    await monitor.poll_once()
    busy = monitor.health("sg")
    assert busy.saturated and (busy.running, busy.waiting) == (30, 9)
    assert busy.kv_usage == pytest.approx(0.93)
    assert busy.cache_hit_rate == pytest.approx((3.104117e06 + 215003.0) / 8.128902e06)
    assert not monitor.health("tgi").saturated  # a TGI router before its first request
    trt = monitor.health("trt")
    assert not trt.saturated and trt.kv_usage == 0.0
    assert monitor.status()["trt"]["failures"] == 0
    # The pools the pages state (in blocks, in tokens) bound the prefix index: 4 characters
    # per token, 64-character blocks.
    assert monitor.prefix_index is not None
    assert monitor.prefix_index.capacity("trt") == 64 * 6239 * 4 // 64
    assert monitor.prefix_index.capacity("sg") == 2 * 207156 * 4 // 64
    assert monitor.prefix_index.capacity("tgi") == 161040 * 4 // 64


async def test_unknown_kv_leaves_saturation_to_the_queue(
    served: tuple[Pages, str], client: httpx.AsyncClient
) -> None:
    pages, _ = served
    pages.texts["cpp"] = page("llamacpp_idle")
    monitor = watch(served, client, FakeClock(), cpp="llamacpp")
    await monitor.poll_once()
    idle = monitor.health("cpp")
    assert not idle.saturated and idle.kv_usage == 0.0  # unknown KV gives the rule 0
    monitor.sent("cpp", tokens=100_000)  # no pool size: prompt tokens cannot move KV use
    assert monitor.signals("cpp").kv_usage == 0.0
    monitor.done("cpp", tokens=100_000)
    pages.texts["cpp"] = page("llamacpp_busy")
    await monitor.poll_once()
    busy = monitor.health("cpp")
    assert busy.saturated and (busy.running, busy.waiting) == (4, 6)
    assert monitor.status()["cpp"]["slots"] == 4  # deferred requests mean every slot is busy


async def test_ttft_from_the_engines_own_histogram(
    served: tuple[Pages, str], client: httpx.AsyncClient
) -> None:
    pages, _ = served
    pages.texts["sg"] = page("sglang_busy")
    monitor = watch(served, client, FakeClock(), sg="sglang")
    await monitor.poll_once()
    assert monitor.predicted_ttft("sg") is None  # one reading is a baseline, not a delta
    later = re.sub(
        r"^(sglang:time_to_first_token_seconds_sum\{[^}]*\}) \S+$",
        r"\g<1> 1636.7462",
        page("sglang_busy"),
        flags=re.M,
    )
    later = re.sub(
        r"^(sglang:time_to_first_token_seconds_count\{[^}]*\}) \S+$",
        r"\g<1> 2067.0",
        later,
        flags=re.M,
    )
    pages.texts["sg"] = later
    await monitor.poll_once()
    # 6 s over 4 new first tokens, times (1 + 9 waiting).
    assert monitor.predicted_ttft("sg") == pytest.approx(1.5 * 10)


async def test_changing_a_replicas_engine_starts_it_afresh(
    served: tuple[Pages, str], client: httpx.AsyncClient
) -> None:
    pages, url = served
    pages.texts["r"] = page("llamacpp_busy")
    monitor = watch(served, client, FakeClock(), r="vllm")
    await monitor.poll_once()
    assert monitor.status()["r"]["failures"] == 1  # a llama.cpp page is no vLLM page
    monitor.configure({"r": ReplicaSpec(f"{url}/r/metrics", SaturationConfig(), engine="llamacpp")})
    await monitor.poll_once()
    assert monitor.status()["r"]["failures"] == 0
    assert monitor.health("r").waiting == 6
