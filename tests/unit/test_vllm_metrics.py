"""local_tier.vllm.metrics on /metrics pages captured from a real vLLM 0.32.0 (CPU build)
serving SmolLM2-135M-Instruct: ``vllm_metrics.txt`` idle after one prefix-cache hit of 256
tokens, ``vllm_metrics_busy.txt`` while 12 requests were in flight."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from core.clock import FakeClock
from local_tier.vllm.metrics import (
    MetricsError,
    MetricsSnapshot,
    afetch_metrics,
    fetch_metrics,
    parse_metrics,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
IDLE = (FIXTURES / "vllm_metrics.txt").read_text()
BUSY = (FIXTURES / "vllm_metrics_busy.txt").read_text()


def test_idle_page_after_a_prefix_hit() -> None:
    snap = parse_metrics(IDLE, read_at=5.0)
    assert snap == MetricsSnapshot(
        read_at=5.0,
        num_requests_running=0,
        num_requests_waiting=0,
        kv_cache_usage_perc=0.0,
        prefix_cache_queries=540.0,
        prefix_cache_hits=256.0,
        block_size=128,
        num_gpu_blocks=364,
    )
    assert snap.idle
    assert snap.prefix_hit_rate == pytest.approx(256 / 540)
    assert snap.kv_capacity_tokens == 128 * 364


def test_busy_page() -> None:
    snap = parse_metrics(BUSY, read_at=0.0)
    assert (snap.num_requests_running, snap.num_requests_waiting) == (9, 3)
    assert snap.kv_cache_usage_perc == pytest.approx(0.07162534435261703)
    assert snap.prefix_cache_queries == 2980.0
    assert not snap.idle


def test_series_of_several_engines_are_summed() -> None:
    # A data-parallel server reports one series per engine: add a copy labelled engine="1".
    extra = [
        line.replace('engine="0"', 'engine="1"')
        for line in BUSY.splitlines()
        if line.startswith(("vllm:num_requests_running{", "vllm:kv_cache_usage_perc{"))
    ]
    lines = BUSY.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("vllm:num_requests_running{"))
    lines.insert(at + 1, extra[0])
    at = next(i for i, line in enumerate(lines) if line.startswith("vllm:kv_cache_usage_perc{"))
    lines.insert(at + 1, extra[1])
    snap = parse_metrics("\n".join(lines) + "\n", read_at=0.0)
    assert snap.num_requests_running == 18
    assert snap.kv_cache_usage_perc == pytest.approx(2 * 0.07162534435261703)


def test_legacy_v0_names_are_read() -> None:
    text = (
        "vllm:num_requests_running 2\nvllm:num_requests_waiting 1\n"
        "vllm:gpu_cache_usage_perc 0.5\nvllm:gpu_prefix_cache_queries_total 10\n"
        "vllm:gpu_prefix_cache_hits_total 4\n"
    )
    snap = parse_metrics(text, read_at=0.0)
    assert snap.kv_cache_usage_perc == 0.5
    assert (snap.prefix_cache_queries, snap.prefix_cache_hits) == (10.0, 4.0)
    assert snap.block_size is None and snap.kv_capacity_tokens is None


def test_optional_series_default_when_absent() -> None:
    text = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n"
    snap = parse_metrics(text, read_at=0.0)
    assert snap.prefix_cache_queries == 0.0 and snap.prefix_hit_rate is None
    assert snap.num_gpu_blocks is None


@pytest.mark.parametrize(
    "series", ["vllm:num_requests_running{", "vllm:num_requests_waiting{", "vllm:kv_cache_usage"]
)
def test_missing_load_signal_is_an_error(series: str) -> None:
    text = "\n".join(line for line in IDLE.splitlines() if not line.startswith(series))
    with pytest.raises(MetricsError, match="missing"):
        parse_metrics(text + "\n", read_at=0.0)


def test_malformed_text_is_an_error() -> None:
    with pytest.raises(MetricsError, match="malformed"):
        parse_metrics('vllm:num_requests_running{engine="0" 1\n', read_at=0.0)


def test_age_uses_the_callers_clock() -> None:
    assert parse_metrics(IDLE, read_at=10.0).age(12.5) == 2.5


def _transport(status: int = 200, body: str = BUSY) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"
        return httpx.Response(status, text=body)

    return httpx.MockTransport(handler)


def test_fetch_stamps_the_read_with_the_clock() -> None:
    clock = FakeClock(start=42.0)
    with httpx.Client(transport=_transport()) as client:
        snap = fetch_metrics("http://127.0.0.1:9/", client, clock)
    assert snap.read_at == 42.0 and snap.num_requests_running == 9


def test_fetch_non_200_is_an_error() -> None:
    with (
        httpx.Client(transport=_transport(503, "busy")) as client,
        pytest.raises(MetricsError, match="503"),
    ):
        fetch_metrics("http://127.0.0.1:9", client)


def test_fetch_transport_failure_is_an_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with (
        httpx.Client(transport=httpx.MockTransport(refuse)) as client,
        pytest.raises(MetricsError, match="failed"),
    ):
        fetch_metrics("http://127.0.0.1:9", client)


@pytest.mark.anyio
async def test_async_fetch() -> None:
    async with httpx.AsyncClient(transport=_transport(body=IDLE)) as client:
        snap = await afetch_metrics("http://127.0.0.1:9", client, FakeClock(start=1.0))
    assert snap.prefix_cache_hits == 256.0 and snap.read_at == 1.0
