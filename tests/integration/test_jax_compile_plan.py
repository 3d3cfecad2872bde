"""The compile plan on the real SmolLM2 engine (fp32, CPU): ``start`` compiles the cover
ahead of time, plans of shapes outside it run padded on a cover shape without compiling, with
the same greedy tokens as an engine that runs every exact bucket shape; the background
thread then compiles every other shape, and no step ever goes through the jitted path.

Small buckets (test_jax_engine's engine with two chunk and three context buckets): 18 step
shapes, a cover of 3.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import msgspec
import pytest

from local_tier.jax import Engine, EngineConfig, SamplingParams
from local_tier.jax.compile_plan import CompilePlan, PlanSpace
from tests.integration.test_jax_engine import CONFIG, chat, run, tokens

pytestmark = [pytest.mark.model, pytest.mark.anyio]

CFG: EngineConfig = msgspec.structs.replace(
    CONFIG,
    warmup=True,
    prefill_chunk_tokens=64,
    prefill_row_buckets=(1, 2),
    prefill_len_buckets=(32, 64),
    context_buckets=(64, 128, 256),
)
QUESTIONS = (
    "What is the capital of France?",
    "Name three colors.",
    "Write a haiku about the sea, then explain it in one sentence please.",
)
PARAMS = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[Engine]:
    eng = Engine.from_config(CFG)
    await eng.start()
    yield eng
    await eng.stop()


async def answers(engine: Engine) -> list[list[int]]:
    """Greedy tokens of QUESTIONS run together (decode batches of 2-3 rows, contexts to 128)."""
    prompts = [chat(engine, q) for q in QUESTIONS]
    outs = await asyncio.gather(*(run(engine, p, PARAMS) for p in prompts))
    return [tokens(o) for o in outs]


async def test_plans_outside_the_cover_run_padded_without_compiling(engine: Engine) -> None:
    runner = engine._runner
    plan = CompilePlan.build(PlanSpace.of(engine._sched, engine.max_model_len))
    assert len(plan.shapes) == 18
    assert set(plan.ready) == {(4, 1, 256), (1, 64, 256), (2, 32, 256)}
    assert engine._compiler is not None
    engine._compiler.stop()  # keep (nearly) only the cover: the plans below run padded
    compiled = runner.compiled_shapes
    assert set(plan.ready) <= compiled
    assert not {(2, 1, 64), (4, 1, 64), (2, 1, 128), (4, 1, 128)} & compiled
    k_before = runner.k_cache

    padded = await answers(engine)

    assert runner.serving_compiles == []  # no step compiled while serving
    assert runner._jit_step._cache_size() == 0  # every step ran an ahead-of-time executable
    assert k_before.is_deleted()  # ... which kept the cache donated (updated in place)
    reference = Engine.from_config(msgspec.structs.replace(CFG, warmup=False))
    await reference.start()
    try:
        exact = await answers(reference)
        assert (4, 1, 64) in reference._runner.serving_compiles  # it ran the exact shapes
    finally:
        await reference.stop()
    assert padded == exact
    assert all(len(t) == PARAMS.max_tokens for t in padded)


async def test_background_compiles_every_shape_then_serves_exact_shapes(engine: Engine) -> None:
    await engine.stop()
    await engine.start()  # the cover is already there; the rest compiles in the background
    compiler = engine._compiler
    assert compiler is not None
    plan = CompilePlan.build(PlanSpace.of(engine._sched, engine.max_model_len))
    first = await answers(engine)  # served while the background thread compiles
    deadline = time.monotonic() + 280
    while compiler.running and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    assert not compiler.running and compiler.error is None
    runner = engine._runner
    assert runner.compiled_shapes == set(plan.shapes)
    assert await answers(engine) == first
    assert runner.serving_compiles == []
    assert runner._jit_step._cache_size() == 0
    assert runner._padded((2, 1, 64)) == (2, 1, 64)  # exact shapes now
