"""The one-step-behind decode loop (``EngineConfig.pipeline_decode``) on the real SmolLM2.

A decode step of an unchanged batch is dispatched before the previous step's tokens are read.
These tests run the same concurrent workloads with the pipeline on and off and require the
same outputs, token for token and piece for piece (text, finish reasons, usage), plus that
steps really were chained, that a sequence ending on a token read late wastes nothing the
others see, and that cancelling a client mid-chain frees its blocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest

from local_tier.jax import Engine, GenerationOutput, GenerationRequest, SamplingParams
from tests.integration.test_jax_engine import CONFIG, chat

pytestmark = [pytest.mark.model, pytest.mark.anyio]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def engines() -> AsyncIterator[dict[bool, Engine]]:
    out = {}
    for pipeline in (False, True):
        eng = Engine.from_config(msgspec.structs.replace(CONFIG, pipeline_decode=pipeline))
        await eng.start()
        out[pipeline] = eng
    yield out
    for eng in out.values():
        await eng.stop()


_ids = iter(range(10**6))


async def run(engine: Engine, prompt: list[int], params: SamplingParams, delay: float = 0.0):
    await asyncio.sleep(delay)
    req = GenerationRequest(f"p{next(_ids)}", prompt, params)
    return [o async for o in engine.generate(req)]


def summary(outs: list[GenerationOutput]) -> list[tuple[str, list[int], str | None, int]]:
    return [(o.text, o.token_ids, o.finish_reason, o.completion_tokens) for o in outs]


async def workload(engine: Engine) -> list[list[GenerationOutput]]:
    """Streams of different lengths and end conditions (EOS, max_tokens, a stop string), a
    late arrival that joins while they decode (the chain breaks for its prefill and resumes),
    and rows sampled on the device with state of their own (min_tokens, a seeded temperature
    and top-p draw, a repetition penalty), which the chain carries on the device."""
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    jobs = [
        run(engine, chat(engine, "What is the capital of France?"), greedy),
        run(
            engine,
            chat(engine, "Count from one to twenty."),
            msgspec.structs.replace(greedy, max_tokens=17),
        ),
        run(
            engine,
            chat(engine, "Name three colors."),
            msgspec.structs.replace(greedy, stop=("Green", "green")),
        ),
        run(engine, chat(engine, "Write a haiku about the sea."), greedy, delay=0.4),
        run(
            engine,
            chat(engine, "Say hi."),
            msgspec.structs.replace(greedy, min_tokens=5, max_tokens=9),
            delay=0.2,
        ),
        run(
            engine,
            chat(engine, "Tell me a story."),
            SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=20),
        ),
        run(
            engine,
            chat(engine, "List some fruits."),
            msgspec.structs.replace(greedy, repetition_penalty=1.3, max_tokens=20),
        ),
    ]
    return list(await asyncio.gather(*jobs))


async def test_pipelined_outputs_equal_step_by_step_outputs(engines: dict[bool, Engine]) -> None:
    plain, piped = engines[False], engines[True]
    before = piped.timing.chained
    want = await workload(plain)
    got = await workload(piped)
    assert [summary(o) for o in got] == [summary(o) for o in want]
    assert {o[-1].finish_reason for o in want} == {"stop", "length"}
    assert plain.timing.chained == 0
    assert piped.timing.chained - before > 10  # most decode steps were chained
    for eng in (plain, piped):
        assert eng.stats().kv_cache_usage_perc == 0.0  # every block came back


async def test_a_sequence_ending_on_a_late_token_leaves_the_others_intact(
    engines: dict[bool, Engine],
) -> None:
    """Short and long streams together: the short ones end (EOS / max_tokens) on tokens read
    while the next step already runs with their rows; the long one must not notice."""
    long = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    results = {}
    for pipeline, eng in engines.items():
        prompt = chat(eng, "Tell me about the moon.")
        shorts = [
            run(eng, chat(eng, "Say yes."), SamplingParams(temperature=0.0, max_tokens=n))
            for n in (1, 2, 3)
        ]
        results[pipeline] = await asyncio.gather(run(eng, prompt, long), *shorts)
    assert [summary(o) for o in results[True]] == [summary(o) for o in results[False]]
    assert results[True][0][-1].completion_tokens == 30


async def test_a_client_leaving_mid_chain_frees_its_blocks(engines: dict[bool, Engine]) -> None:
    eng = engines[True]
    req = GenerationRequest(
        f"p{next(_ids)}",
        chat(eng, "Tell me a long story."),
        SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True),
    )
    chained = eng.timing.chained
    gen = eng.generate(req)
    n = 0
    async for _ in gen:
        n += 1
        if n == 8:
            break
    await gen.aclose()
    other = await run(eng, chat(eng, "Say yes."), SamplingParams(temperature=0.0, max_tokens=4))
    assert other[-1].finish_reason is not None
    assert eng.timing.chained > chained
    assert eng.stats().kv_cache_usage_perc == 0.0
