"""``Replicas``: data-parallel engines behind one front (routing, stats, lifecycle) over the
fake engine; the real engines run in tests/integration/test_jax_tensor_parallel.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from local_tier.jax.api import (
    EngineProtocol,
    EngineRequestError,
    EngineStats,
    GenerationOutput,
    GenerationRequest,
    SamplingParams,
)
from local_tier.jax.replicas import Replicas, merge_stats
from tests.unit.jax_fake import FakeEngine

pytestmark = pytest.mark.anyio


def front_of(fakes: list[FakeEngine]) -> Replicas:
    return Replicas([cast(EngineProtocol, f) for f in fakes])


def stream(front: Replicas, req: GenerationRequest) -> AsyncGenerator[GenerationOutput, Any]:
    return cast(AsyncGenerator[GenerationOutput, Any], front.generate(req))


def request(rid: str, prompt: str = "hi") -> GenerationRequest:
    return GenerationRequest(rid, [ord(c) for c in prompt], SamplingParams(max_tokens=3))


async def test_requests_go_to_the_least_busy_replica_and_free_it_when_done() -> None:
    fakes = [FakeEngine(reply="abc", step_s=0.01) for _ in range(3)]
    front = front_of(fakes)
    await front.start()
    assert all(f.started for f in fakes)
    streams = [stream(front, request(f"r{i}")) for i in range(4)]
    firsts = [await s.__anext__() for s in streams]  # each holds its replica now
    assert [o.text for o in firsts] == ["a"] * 4
    assert [len(f.requests) for f in fakes] == [2, 1, 1]  # round the replicas, then the first
    assert front.in_flight == [2, 1, 1]
    for one in streams:
        rest = [o async for o in one]
        assert rest[-1].finish_reason is not None
    assert front.in_flight == [0, 0, 0]
    await front.stop()
    assert all(f.stopped for f in fakes)


async def test_an_aborted_stream_frees_its_slot() -> None:
    fakes = [FakeEngine(reply="abcdef", step_s=0.01) for _ in range(2)]
    front = front_of(fakes)
    out = stream(front, request("x"))
    await out.__anext__()
    assert front.in_flight == [1, 0]
    await out.aclose()
    assert front.in_flight == [0, 0] and fakes[0].aborted == ["x"]


async def test_errors_surface_and_duplicate_ids_are_refused() -> None:
    front = front_of([FakeEngine(max_model_len=8), FakeEngine(max_model_len=6)])
    assert front.max_model_len == 6
    with pytest.raises(EngineRequestError, match="prompt too long"):
        await front.generate(request("long", "x" * 9)).__anext__()
    assert front.in_flight == [0, 0]
    first = stream(front, request("dup"))
    await first.__anext__()
    with pytest.raises(EngineRequestError, match="already running"):
        await front.generate(request("dup")).__anext__()
    await first.aclose()
    assert [o async for o in front.generate(request("dup"))][-1].finish_reason == "length"


async def test_concurrent_load_spreads_evenly() -> None:
    fakes = [FakeEngine(reply="ab", step_s=0.005, max_running=8) for _ in range(2)]
    front = front_of(fakes)

    async def one(i: int) -> None:
        async for _ in front.generate(request(f"c{i}")):
            pass

    await asyncio.gather(*(one(i) for i in range(8)))
    assert [len(f.requests) for f in fakes] == [4, 4]
    stats = front.stats()
    assert stats.generation_tokens_total == 16 and stats.num_blocks == 128


def stats(running: int, blocks: int, usage: float, finished: int) -> EngineStats:
    return EngineStats(running, 1, usage, 10, 4, 7, 3, 16, blocks, 1, finished)


@given(
    st.lists(
        st.tuples(st.integers(0, 9), st.integers(1, 500), st.floats(0, 1), st.integers(0, 99)),
        min_size=1,
        max_size=5,
    )
)
def test_merged_stats_add_up_and_usage_stays_a_share(
    parts: list[tuple[int, int, float, int]],
) -> None:
    each = [stats(*p) for p in parts]
    merged = merge_stats(each)
    assert merged.num_requests_running == sum(p[0] for p in parts)
    assert merged.num_blocks == sum(p[1] for p in parts)
    assert merged.requests_finished_total == sum(p[3] for p in parts)
    assert merged.num_requests_waiting == len(parts) and merged.block_size == 16
    used = sum(s.kv_cache_usage_perc * s.num_blocks for s in each)
    assert merged.kv_cache_usage_perc == pytest.approx(used / merged.num_blocks)
    assert min(p[2] for p in parts) - 1e-9 <= merged.kv_cache_usage_perc
    assert merged.kv_cache_usage_perc <= max(p[2] for p in parts) + 1e-9


def test_no_engines_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one engine"):
        Replicas([])


def test_one_engine_refuses_data_parallel_and_points_at_build_engine() -> None:
    from local_tier.jax.api import EngineConfig
    from local_tier.jax.engine import Engine

    with pytest.raises(ValueError, match="build_engine"):
        Engine.from_config(EngineConfig(data_parallel=2))
