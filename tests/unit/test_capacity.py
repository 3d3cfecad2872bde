"""local_tier.capacity against a real HTTP server on 127.0.0.1 serving /metrics pages built
from the captured vLLM pages (tests/fixtures/vllm_metrics*.txt). Time is a FakeClock: polls
are driven by ``poll_once()`` or by an injected sleep, never by waiting."""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.clock import FakeClock
from core.config import VllmProviderConfig
from core.config_routing import BreakerConfig, SaturationConfig
from core.routing import UNKNOWN, RouteRequest
from gateway.process.health import TrackerObserver, Trackers
from local_tier.capacity import CapacityMonitor
from local_tier.prefix_index import PrefixIndex, whole_kv_blocks
from local_tier.replicas import ReplicaSpec, metrics_url
from local_tier.vllm.metrics import parse_metrics, split_page, ttft_totals
from policies.breaker import SharedBreakers
from policies.latency import LatencyStats
from policies.store import MemoryStore
from tests.fixtures.server import ServerThread

pytestmark = pytest.mark.anyio

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
IDLE = (FIXTURES / "vllm_metrics.txt").read_text()
BUSY = (FIXTURES / "vllm_metrics_busy.txt").read_text()
KV_TOKENS = 128 * 364  # the fixtures' cache_config_info


def page(
    running: int = 0,
    waiting: int = 0,
    kv: float = 0.0,
    queries: float = 540.0,
    ttft: tuple[float, float] = (7.97632908821106, 2.0),
) -> str:
    """The idle fixture page with its load series rewritten."""
    values = {
        "vllm:num_requests_running": running,
        "vllm:num_requests_waiting": waiting,
        "vllm:kv_cache_usage_perc": kv,
        "vllm:prefix_cache_queries_total": queries,
        "vllm:time_to_first_token_seconds_sum": ttft[0],
        "vllm:time_to_first_token_seconds_count": ttft[1],
    }
    text = IDLE
    for name, value in values.items():
        text = re.sub(
            rf"^({re.escape(name)}\{{[^}}]*\}}) \S+$", rf"\g<1> {float(value)}", text, flags=re.M
        )
    return text


@dataclass
class MetricsServer:
    """What /metrics answers: ``text`` with ``status``; ``delay_s`` before answering."""

    text: str = IDLE
    status: int = 200
    delay_s: float = 0.0
    hits: int = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.hits += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        body = self.text.encode()
        await send(
            {
                "type": "http.response.start",
                "status": self.status,
                "headers": [(b"content-type", b"text/plain; version=0.0.4")],
            }
        )
        await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[MetricsServer, str]]:
    app = MetricsServer()
    server = ServerThread(app).start()
    try:
        yield app, server.url
    finally:
        server.stop()


@pytest.fixture
def metrics(served: tuple[MetricsServer, str]) -> MetricsServer:
    app, _ = served
    app.text, app.status, app.delay_s, app.hits = IDLE, 200, 0.0, 0
    return app


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False) as http:
        yield http


def monitor_for(
    url: str, client: httpx.AsyncClient, clock: FakeClock, **kw: Any
) -> CapacityMonitor:
    slots = kw.pop("slots", None)
    saturation = kw.pop("saturation", SaturationConfig())
    # The fake /metrics server is a thread of this process: on a loaded 2-core machine it
    # was once starved past the product's 0.5 s poll timeout and a poll read as failed.
    kw.setdefault("poll_timeout_s", 5.0)
    spec = ReplicaSpec(f"{url}/metrics", saturation, slots)
    return CapacityMonitor({"w": spec}, client, clock, **kw)


# ---------------------------------------------------------------- pure helpers
def test_metrics_url_from_the_provider_config() -> None:
    assert metrics_url(VllmProviderConfig(base_url="http://h:8000/v1")) == "http://h:8000/metrics"
    assert metrics_url(VllmProviderConfig(base_url="http://h:8000/v1/")) == "http://h:8000/metrics"
    assert metrics_url(VllmProviderConfig(base_url="http://h:9/x")) == "http://h:9/x/metrics"
    cfg = VllmProviderConfig(metrics_url="http://m:1/prom")
    assert metrics_url(cfg) == "http://m:1/prom"
    spec = ReplicaSpec.from_provider(VllmProviderConfig(saturation=SaturationConfig(max_waiting=3)))
    assert spec.metrics_url == "http://127.0.0.1:8000/metrics"
    assert spec.saturation.max_waiting == 3


def test_cut_page_parses_like_the_whole_page() -> None:
    for text in (IDLE, BUSY):
        cut, _ = split_page(text)
        assert parse_metrics(cut, read_at=1.0) == parse_metrics(text, read_at=1.0)
        assert len(cut.splitlines()) < 10
    assert ttft_totals(split_page(BUSY)[1]) == (pytest.approx(513.9147846698761), 10.0)
    assert ttft_totals("") is None


# ---------------------------------------------------------------- polling and health
async def test_before_any_poll_a_replica_is_saturated(client: httpx.AsyncClient) -> None:
    monitor = monitor_for("http://127.0.0.1:9", client, FakeClock())
    assert monitor.health("w").saturated
    assert not monitor.can_take("w")
    # Targets it does not watch are not its business.
    assert monitor.health("openai/gpt-4o") is UNKNOWN
    assert monitor.can_take("openai/gpt-4o", 0.1)
    assert not monitor.saturated("openai/gpt-4o")


async def test_idle_then_busy_page(metrics: MetricsServer, served: Any, client: Any) -> None:
    clock = FakeClock()
    monitor = monitor_for(served[1], client, clock)
    await monitor.poll_once()
    health = monitor.health("w")
    assert not health.saturated and monitor.can_take("w")
    assert (health.running, health.waiting, health.kv_usage) == (0, 0, 0.0)
    assert health.cache_hit_rate == pytest.approx(256 / 540)
    metrics.text = BUSY
    await monitor.poll_once()
    busy = monitor.health("w")
    assert busy.saturated and (busy.running, busy.waiting) == (9, 3)
    assert monitor.status()["w"]["slots"] == 9  # learned: a queue means a full batch


async def test_failed_polls_keep_the_last_snapshot_until_stale(
    metrics: MetricsServer, served: Any, client: Any
) -> None:
    clock = FakeClock()
    monitor = monitor_for(served[1], client, clock)
    await monitor.poll_once()
    metrics.status = 500
    clock.advance(0.5)
    await monitor.poll_once()
    assert not monitor.health("w").saturated  # 0.5 s old: still fresh
    assert monitor.status()["w"]["failures"] == 1
    clock.advance(0.6)
    assert monitor.health("w").saturated  # 1.1 s old: stale counts as saturated
    metrics.status, metrics.text = 200, "not a metrics page {"
    await monitor.poll_once()
    assert monitor.status()["w"]["failures"] == 2
    metrics.text = IDLE
    await monitor.poll_once()
    assert not monitor.health("w").saturated and monitor.status()["w"]["failures"] == 0


async def test_connection_refused_is_a_failed_poll(client: httpx.AsyncClient) -> None:
    from tests.fixtures.server import free_port

    monitor = monitor_for(f"http://127.0.0.1:{free_port()}", client, FakeClock())
    await monitor.poll_once()
    status = monitor.status()["w"]
    assert status["failures"] == 1 and "Connect" in str(status["last_error"])
    assert monitor.health("w").saturated


async def test_each_poll_is_bounded_by_its_timeout(
    metrics: MetricsServer, served: Any, client: Any
) -> None:
    metrics.delay_s = 5.0
    monitor = monitor_for(served[1], client, FakeClock(), poll_timeout_s=0.2)
    await asyncio.wait_for(monitor.poll_once(), timeout=3.0)
    assert monitor.status()["w"]["failures"] == 1


async def test_burst_between_polls_fills_the_batch_on_paper(
    metrics: MetricsServer, served: Any, client: Any
) -> None:
    metrics.text = page(running=2)
    monitor = monitor_for(served[1], client, FakeClock(), slots=4)
    await monitor.poll_once()
    assert monitor.can_take("w")
    for _ in range(2):
        monitor.sent("w")
    assert monitor.can_take("w")  # 2 + 2 = 4 slots: full, nothing waiting yet
    monitor.sent("w")
    health = monitor.health("w")
    assert (health.running, health.waiting, health.in_flight) == (4, 1, 3)
    assert health.saturated and not monitor.can_take("w")
    # The next poll shows the replica's own view; the baseline moves with it.
    metrics.text = page(running=4, waiting=1)
    await monitor.poll_once()
    assert monitor.health("w").waiting == 1
    for _ in range(3):
        monitor.done("w")
    after = monitor.health("w")
    assert (after.running, after.waiting, after.in_flight) == (2, 0, 0)
    assert not after.saturated


async def test_in_flight_limit(metrics: MetricsServer, served: Any, client: Any) -> None:
    monitor = monitor_for(
        served[1], client, FakeClock(), saturation=SaturationConfig(max_in_flight=2)
    )
    await monitor.poll_once()
    monitor.sent("w")
    assert monitor.can_take("w")
    monitor.sent("w")
    assert not monitor.can_take("w")
    monitor.done("w")
    assert monitor.can_take("w")


async def test_prompt_tokens_in_flight_count_towards_kv(
    metrics: MetricsServer, served: Any, client: Any
) -> None:
    metrics.text = page(kv=0.5)
    monitor = monitor_for(served[1], client, FakeClock())
    await monitor.poll_once()
    monitor.sent("w", tokens=int(KV_TOKENS * 0.45))
    health = monitor.health("w")
    assert health.kv_usage == pytest.approx(0.95, abs=1e-3) and health.saturated
    monitor.done("w", tokens=int(KV_TOKENS * 0.45))
    assert monitor.health("w").kv_usage == pytest.approx(0.5)
    assert not monitor.health("w").saturated  # 0.5 < kv_low


async def test_ttft_from_histogram_deltas_and_the_objective(
    metrics: MetricsServer, served: Any, client: Any
) -> None:
    monitor = monitor_for(served[1], client, FakeClock(), ttft_alpha=0.5)
    metrics.text = page(ttft=(10.0, 10.0))
    await monitor.poll_once()
    assert monitor.predicted_ttft("w") is None  # one reading: no delta yet
    assert monitor.can_take("w", 0.001)  # no data: only saturation decides
    metrics.text = page(ttft=(14.0, 12.0))  # two more requests, 2 s each
    await monitor.poll_once()
    assert monitor.health("w").ttft_s == pytest.approx(2.0)
    assert monitor.can_take("w", 2.5) and not monitor.can_take("w", 1.5)
    metrics.text = page(ttft=(14.0, 12.0), running=4, waiting=0)
    await monitor.poll_once()  # no new requests: the EWMA stays
    monitor.observe_ttft("w", 1.0)  # the gateway's own measurement blends in
    assert monitor.predicted_ttft("w") == pytest.approx(1.5)
    # Behind a queue of two (max_waiting=2 so it is not saturated) it is three TTFTs.
    relaxed = monitor_for(
        served[1], client, FakeClock(), saturation=SaturationConfig(max_waiting=2)
    )
    metrics.text = page(ttft=(10.0, 10.0), running=4, waiting=2)
    await relaxed.poll_once()
    relaxed.observe_ttft("w", 0.5)
    assert relaxed.predicted_ttft("w") == pytest.approx(1.5)
    assert relaxed.can_take("w", 1.6) and not relaxed.can_take("w", 1.4)


async def test_idle_replica_drops_its_old_ttft(
    metrics: MetricsServer, served: Any, client: Any
) -> None:
    monitor = monitor_for(served[1], client, FakeClock())
    metrics.text = page(ttft=(10.0, 10.0), running=2)
    await monitor.poll_once()
    metrics.text = page(ttft=(30.0, 12.0), running=2)  # 10 s each: slow, under load
    await monitor.poll_once()
    assert not monitor.can_take("w", 5.0)
    monitor.sent("w")
    metrics.text = page(ttft=(30.0, 12.0))  # idle, but our own request is still out
    await monitor.poll_once()
    assert monitor.predicted_ttft("w") == pytest.approx(10.0)
    monitor.done("w")
    await monitor.poll_once()  # idle, nothing in flight, nothing new: the estimate goes
    assert monitor.predicted_ttft("w") is None and monitor.can_take("w", 5.0)


async def test_restart_resets_baselines_and_forgets_prefixes(
    metrics: MetricsServer, served: Any, client: Any
) -> None:
    clock = FakeClock()
    index = PrefixIndex(10, clock)
    monitor = monitor_for(served[1], client, clock, prefix_index=index)
    metrics.text = page(queries=1000, ttft=(100.0, 50.0))
    await monitor.poll_once()
    assert index.capacity("w") == KV_TOKENS * 4 // 64  # from cache_config_info
    index.record("w", tuple(range(1, 18)))
    # 10 routing blocks (64 characters, ~16 tokens) match; the page's KV blocks are 128
    # tokens (8 routing blocks), and the worker reuses whole ones only: 8 count.
    assert monitor.health("w", (*range(1, 11), 99)).prefix_blocks == 8
    assert monitor.health("w", (1, 2, 9)).prefix_blocks == 0  # less than one KV block
    assert monitor.health("w").prefix_blocks == 0
    metrics.text = page(queries=10, ttft=(1.0, 1.0))  # counters went back: a new process
    await monitor.poll_once()
    assert index.matched("w", (1, 2, 3)) == 0
    assert monitor.health("w").ttft_s is None  # the drop was not read as a TTFT
    metrics.text = page(queries=20, ttft=(4.0, 2.0))
    await monitor.poll_once()
    assert monitor.health("w").ttft_s == pytest.approx(3.0)


async def test_gateway_observer_holds_a_replica_until_the_request_ends(
    metrics: MetricsServer, served: Any, client: Any
) -> None:
    """The gateway's attempt observer counts a local attempt in flight from its start until
    it fails or, when it succeeded, until the request ends (a stream keeps the replica busy
    after its first chunk); only successful attempts teach a TTFT."""
    clock = FakeClock()
    monitor = monitor_for(served[1], client, clock)
    await monitor.poll_once()
    store = MemoryStore(clock)
    trackers = Trackers(SharedBreakers(BreakerConfig(), store, clock), LatencyStats(clock), monitor)
    observer = TrackerObserver(trackers)
    observer.attempt_started("w")
    observer.attempt_started("elsewhere")  # ignored
    assert monitor.health("w").in_flight == 1
    observer.attempt_finished("w", error=None, ttft_s=0.3, retryable=False)
    assert monitor.health("w").in_flight == 1 and monitor.health("w").ttft_s == 0.3
    observer.release()
    assert monitor.health("w").in_flight == 0
    observer.attempt_started("w")
    observer.attempt_finished("w", error="UpstreamTimeoutError", ttft_s=9.0, retryable=False)
    assert monitor.health("w").ttft_s == 0.3  # failed calls teach nothing about TTFT
    assert monitor.health("w").in_flight == 0
    monitor.done("w")  # more done than sent never goes negative
    assert monitor.health("w").in_flight == 0


async def test_background_loop_polls_each_interval(
    metrics: MetricsServer, served: Any, client: Any
) -> None:
    clock = FakeClock()
    naps: list[float] = []
    rounds = asyncio.Event()
    polled: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        naps.append(seconds)
        clock.advance(seconds)
        if len(naps) >= 5:
            rounds.set()
            await asyncio.Event().wait()  # park here until cancelled
        await asyncio.sleep(0)

    monitor = monitor_for(
        served[1],
        client,
        clock,
        sleep=fake_sleep,
        saturation=SaturationConfig(poll_interval_s=0.05),
        on_poll=lambda: polled.append(clock.now()),
    )
    await monitor.start()
    await monitor.start()  # idempotent: still one task
    await asyncio.wait_for(rounds.wait(), timeout=10)
    await monitor.aclose()
    assert naps == [pytest.approx(0.05)] * 5
    assert len(polled) == 5 and metrics.hits == 5
    assert [b - a for a, b in itertools.pairwise(polled)] == [pytest.approx(0.05)] * 4
    await monitor.aclose()  # twice is harmless


async def test_replicas_are_polled_on_their_own_intervals(
    metrics: MetricsServer, served: Any, client: Any
) -> None:
    clock = FakeClock()
    fast = ReplicaSpec(f"{served[1]}/metrics", SaturationConfig(poll_interval_s=0.25))
    slow = ReplicaSpec(f"{served[1]}/metrics", SaturationConfig(poll_interval_s=0.5))
    naps: list[float] = []
    six = asyncio.Event()

    async def fake_sleep(seconds: float) -> None:
        naps.append(seconds)
        clock.advance(seconds)
        if len(naps) == 6:
            six.set()
            await asyncio.Event().wait()  # park until cancelled

    monitor = CapacityMonitor({"fast": fast, "slow": slow}, client, clock, sleep=fake_sleep)
    await monitor.start()
    await asyncio.wait_for(six.wait(), timeout=10)
    await monitor.aclose()
    assert naps == [0.25] * 6
    status = monitor.status()
    assert (status["fast"]["polls"], status["slow"]["polls"]) == (6, 3)
    assert metrics.hits == 9


async def test_a_local_replica_keeps_its_cut_penalty_in_the_routing_view(
    metrics: MetricsServer, served: Any, client: Any
) -> None:
    """What routing sees of a local replica is the latency view (fits, load factor, cut
    penalty) with the replica's signals laid over it: an attempt cut at its first-token
    deadline makes the replica look slower, as it does any other target."""
    clock = FakeClock()
    monitor = monitor_for(served[1], client, clock)
    await monitor.poll_once()
    trackers = Trackers(
        SharedBreakers(BreakerConfig(), MemoryStore(clock), clock), LatencyStats(clock), monitor
    )
    trackers.latency.cuts.cut("w", 1.5, 100)
    seen = trackers.view(RouteRequest(model="m", prompt_tokens=100)).health("w")
    assert seen.ttft_penalty > 1.0 and seen.ttft_floor_s == 1.5
    assert seen.running == monitor.health("w").running  # and the replica's own signals


@pytest.mark.parametrize(
    ("matched", "kv_block_tokens", "whole"),
    [(0, 16, 0), (5, 16, 5), (7, 128, 0), (8, 128, 8), (17, 128, 16), (3, 8, 3), (9, 32, 8)],
)
def test_prefix_matches_count_in_whole_kv_blocks(matched: int, kv_block_tokens: int, whole: int):
    assert whole_kv_blocks(matched, kv_block_tokens) == whole
