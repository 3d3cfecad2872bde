"""The compile plan on the real SmolLM2 engine (fp32, CPU): ``start`` compiles the ready
set ahead of time, plans of shapes outside it run padded on a ready shape without compiling,
with the same greedy tokens as an engine that runs every exact bucket shape; the background
thread then compiles every other shape, and no step ever goes through the jitted path.

Small buckets (test_jax_engine's engine with two chunk buckets): 5 step shapes, 4 ready
(both decode shapes; prefill (1, 64) and (2, 32), which serve (1, 32) padded).
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
)
C = 256  # the block table's width: max_model_len
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
    """Greedy tokens of a short prompt alone (a (1, 32) prefill plan), then of QUESTIONS run
    together (decode batches of 2-3 rows, contexts to 128)."""
    solo = tokens(await run(engine, engine.tokenizer.encode("The sea is"), PARAMS))
    prompts = [chat(engine, q) for q in QUESTIONS]
    outs = await asyncio.gather(*(run(engine, p, PARAMS) for p in prompts))
    return [solo] + [tokens(o) for o in outs]


async def test_plans_outside_the_cover_run_padded_without_compiling(engine: Engine) -> None:
    runner = engine._runner
    plan = CompilePlan.build(PlanSpace.of(engine._sched, engine.max_model_len))
    assert len(plan.shapes) == 5
    assert set(plan.ready) == {(2, 1, C), (4, 1, C), (1, 64, C), (2, 32, C)}
    assert engine._compiler is not None
    engine._compiler.stop()  # keep (nearly) only the ready set: (1, 32) runs padded
    if runner.compiled_shapes != set(plan.ready):  # the background got there first
        runner._compiled = {s: runner._compiled[s] for s in plan.ready}
        runner._serve_memo = {}
    k_before = runner.k_cache

    padded = await answers(engine)

    assert runner._serve_memo[(1, 32, C)] != (1, 32, C)  # ... it ran padded
    assert all(need == ran for need, ran in runner._serve_memo.items() if need[1] == 1)
    assert runner.serving_compiles == []  # no step compiled while serving
    assert runner._jit_step._cache_size() == 0  # every step ran an ahead-of-time executable
    assert k_before.is_deleted()  # ... which kept the cache donated (updated in place)
    reference = Engine.from_config(msgspec.structs.replace(CFG, warmup=False))
    await reference.start()
    try:
        exact = await answers(reference)
        assert (1, 32, C) in reference._runner.serving_compiles  # it ran the exact shapes
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
    assert runner._padded((1, 32, C)) == (1, 32, C)  # exact shapes now
