"""The JAX engine on the real SmolLM2-135M-Instruct (fp32, CPU).

One engine per module, with a small cache and few compiled shapes (decode at 2 and 4 rows,
two-row prefill chunks of 32 tokens, contexts padded to 256), so the module compiles four step
shapes once (cached on disk across runs), plus three for the bf16 check at the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from local_tier.jax import (
    Engine,
    EngineConfig,
    EngineOverloadedError,
    EngineRequestError,
    GenerationOutput,
    GenerationRequest,
    SamplingParams,
    render_chat_prompt,
)

pytestmark = [pytest.mark.model, pytest.mark.anyio]

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
CONFIG = EngineConfig(
    dtype="float32",
    max_batch_size=4,
    max_model_len=256,
    kv_cache_tokens=512,
    block_size=16,
    prefill_chunk_tokens=32,
    max_waiting=8,
    warmup=False,
    decode_batch_buckets=(2, 4),
    prefill_row_buckets=(2,),
    prefill_len_buckets=(32,),
)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


PROGRESS: list[str] = []  # the engine's progress messages


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[Engine]:
    eng = Engine.from_config(CONFIG, progress=PROGRESS.append)
    await eng.start()
    yield eng
    await eng.stop()


_ids = iter(range(10**6))


def chat(engine: Engine, text: str, system: str | None = None) -> list[int]:
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": text}
    ]
    return engine.tokenizer.encode(render_chat_prompt(engine.tokenizer, msgs))


async def run(
    engine: Engine, prompt: list[int], params: SamplingParams = GREEDY
) -> list[GenerationOutput]:
    req = GenerationRequest(f"t{next(_ids)}", prompt, params)
    return [o async for o in engine.generate(req)]


def tokens(outs: list[GenerationOutput]) -> list[int]:
    return [t for o in outs for t in o.token_ids]


def text(outs: list[GenerationOutput]) -> str:
    return "".join(o.text for o in outs)


async def test_capital_of_france_greedy_fp32(engine: Engine) -> None:
    prompt = chat(engine, "What is the capital of France?")
    assert len(prompt) == 37
    outs = await run(engine, prompt, SamplingParams(temperature=0.0, max_tokens=30))
    assert text(outs) == "The capital of France is Paris."
    last = outs[-1]
    assert last.finish_reason == "stop" and last.prompt_tokens == 37
    assert last.completion_tokens == len(tokens(outs))  # EOS counted, not printed


async def test_logits_match_numpy_reference(engine: Engine) -> None:
    from local_tier.jax.gguf_loader import load_gguf
    from local_tier.jax.reference import reference_logits
    from local_tier.jax.scheduler import PrefillItem, Sequence, StepPlan

    prompt = engine.tokenizer.encode("The quick brown fox jumps over the lazy dog. It")
    runner, pool = engine._runner, engine._sched.pool
    seq = Sequence("ref", prompt, max_tokens=4)
    seq.blocks = [pool.allocate() for _ in range(4)]
    try:
        got = []
        split = 7  # two prefill chunks: the second attends to cached context
        for start, n in ((0, split), (split, len(prompt) - split)):
            _, lg = runner.execute(
                runner.prepare(StepPlan("prefill", [PrefillItem(seq, start, n, True)]))
            )
            seq.num_computed += n
        got.append(lg[0])
        for _ in range(3):  # decode steps feed the greedy token back
            seq.output_ids.append(int(np.argmax(got[-1])))
            _, lg = runner.execute(runner.prepare(StepPlan("decode", decode=[seq])))
            seq.num_computed += 1
            got.append(lg[0])
    finally:
        pool.release(seq.blocks)
    ref = reference_logits(load_gguf(), seq.all_ids)
    for i, logits in enumerate(got):
        want = ref[len(prompt) - 1 + i]
        np.testing.assert_allclose(logits, want, atol=2e-3, rtol=0)
        assert int(np.argmax(logits)) == int(np.argmax(want))


async def test_batching_invariance(engine: Engine) -> None:
    a = chat(engine, "What is the capital of France?")
    b = chat(engine, "Name three colors.")
    c = chat(engine, "Write a haiku about the sea.")
    solo_a = tokens(await run(engine, a))
    solo_b = tokens(await run(engine, b))

    async def late_a() -> list[GenerationOutput]:
        await asyncio.sleep(0.3)  # join while b and c are already decoding
        return await run(engine, a)

    mixed = await asyncio.gather(run(engine, b), run(engine, c), late_a())
    assert tokens(mixed[0]) == solo_b
    assert tokens(mixed[2]) == solo_a


async def test_prefix_cache_hit_gives_same_tokens(engine: Engine) -> None:
    system = "You are a terse assistant for a train timetable service in Zurich. " * 3
    prompt = chat(engine, "When is the next train?", system=system)
    before = engine.stats()
    cold = await run(engine, prompt)
    warm = await run(engine, prompt)
    after = engine.stats()
    assert cold[-1].cached_tokens == 0
    assert warm[-1].cached_tokens >= len(prompt) - 16 and warm[-1].cached_tokens % 16 == 0
    assert tokens(warm) == tokens(cold)
    hits = after.prefix_cache_hits_total - before.prefix_cache_hits_total
    assert hits == warm[-1].cached_tokens
    assert after.prefix_cache_queries_total - before.prefix_cache_queries_total == 2 * len(prompt)


async def test_seeded_sampling_is_reproducible(engine: Engine) -> None:
    prompt = chat(engine, "Tell me a story.")
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=1234, max_tokens=8)
    first, second = await asyncio.gather(run(engine, prompt, params), run(engine, prompt, params))
    assert tokens(first) == tokens(second)


async def test_stop_string_is_not_in_output(engine: Engine) -> None:
    prompt = chat(engine, "What is the capital of France?")
    outs = await run(
        engine, prompt, SamplingParams(temperature=0.0, max_tokens=20, stop=(" Paris",))
    )
    assert text(outs) == "The capital of France is"
    assert outs[-1].finish_reason == "stop"


@pytest.mark.parametrize(
    ("params", "param"),
    [
        (SamplingParams(temperature=-1.0), "temperature"),
        (SamplingParams(temperature=float("nan")), "temperature"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_k=-1), "top_k"),
        (SamplingParams(max_tokens=0), "max_tokens"),
        (SamplingParams(max_tokens=250), "max_tokens"),  # 37 + 250 > 256
    ],
)
async def test_bad_sampling_values_are_rejected(
    engine: Engine, params: SamplingParams, param: str
) -> None:
    with pytest.raises(EngineRequestError) as exc:
        await run(engine, chat(engine, "What is the capital of France?"), params)
    assert exc.value.param == param


async def test_prompt_longer_than_context_is_rejected(engine: Engine) -> None:
    with pytest.raises(EngineRequestError, match="maximum context length") as exc:
        await run(engine, [42] * 300)
    assert exc.value.code == "context_length_exceeded"


async def test_cancelled_generation_frees_its_blocks(engine: Engine) -> None:
    gen = engine.generate(
        GenerationRequest(
            "cancel-me",
            chat(engine, "Tell me a long story."),
            SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True),
        )
    )
    got = [await gen.__anext__() for _ in range(2)]
    assert all(o.finish_reason is None for o in got)
    await gen.aclose()
    for _ in range(100):
        s = engine.stats()
        if s.num_requests_running == 0 and s.kv_cache_usage_perc == 0.0:
            break
        await asyncio.sleep(0.05)
    assert s.num_requests_running == 0 and s.kv_cache_usage_perc == 0.0
    outs = await run(engine, chat(engine, "What is the capital of France?"))
    assert outs[-1].finish_reason is not None  # still serving


async def test_more_requests_than_the_cache_holds_wait_and_complete(engine: Engine) -> None:
    seen: list[Any] = []

    async def watch() -> None:
        while True:
            seen.append(engine.stats())
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    try:
        # 200-token prompts + 8 = 13 blocks each; the cache has 32: only two fit at once.
        outs = await asyncio.gather(
            *[run(engine, [1000 + 37 * i + j for j in range(200)], params) for i in range(5)]
        )
    finally:
        watcher.cancel()
    assert all(o[-1].finish_reason == "length" and o[-1].completion_tokens == 8 for o in outs)
    assert max(s.num_requests_running for s in seen) == 2
    assert max(s.num_requests_waiting for s in seen) >= 1
    assert engine.stats().kv_cache_usage_perc == 0.0


async def test_queue_bound_raises_overloaded(engine: Engine) -> None:
    prompt = chat(engine, "Hi")
    params = SamplingParams(temperature=0.0, max_tokens=1)
    gens = [engine.generate(GenerationRequest(f"ovl{i}", prompt, params)) for i in range(12)]
    firsts = await asyncio.gather(*[g.__anext__() for g in gens], return_exceptions=True)
    overloaded = [f for f in firsts if isinstance(f, EngineOverloadedError)]
    assert len(overloaded) == 4
    for g in gens:
        await g.aclose()


async def test_tokenizer_round_trip_and_template(engine: Engine) -> None:
    tok = engine.tokenizer
    s = "héllo 12345 世界 <|im_end|>"
    ids = tok.encode(s)
    assert 2 in ids  # control tokens are special
    assert tok.decode(ids, skip_special_tokens=False) == s
    assert len(tok.encode("12345")) == 5  # every digit is its own token
    prompt = render_chat_prompt(
        tok,
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ],
    )
    assert "You are a helpful AI assistant named SmolLM" in prompt
    assert prompt.endswith("<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token_ids[0] == 2


async def test_default_bf16_path_answers_the_same() -> None:
    """The default weights (bf16 decode, fp32 prefill on CPU) and bf16 KV cache (stored as
    uint16 bits) give the fp32 answer on the pinned prompt."""
    import msgspec

    eng = Engine.from_config(msgspec.structs.replace(CONFIG, dtype="bfloat16"))
    await eng.start()
    try:
        prompt = chat(eng, "What is the capital of France?")
        outs = await run(eng, prompt, SamplingParams(temperature=0.0, max_tokens=30))
        assert text(outs) == "The capital of France is Paris."
    finally:
        await eng.stop()


async def test_a_shape_compiled_while_serving_is_reported(engine: Engine) -> None:
    """With warm-up off, the first prefill and decode steps compile while serving; each new
    shape is reported once (an operator sees which bucket the warm-up lacks)."""
    await run(engine, chat(engine, "Name a colour."))
    compiled = [m for m in PROGRESS if m.startswith("compiled step")]
    assert any(m.startswith("compiled step B=2 T=32 ctx=") for m in compiled)
    assert any(m.startswith("compiled step B=2 T=1 ctx=256") for m in compiled)
    assert len(compiled) == len({m.split(" in ")[0] for m in compiled})  # each shape once


async def test_batch_priority_pauses_while_an_interactive_request_runs(engine: Engine) -> None:
    """Priority-1 (batch) sequences make no progress between an interactive request's
    arrival and its end, and all of them still finish with every token."""
    events: list[tuple[str, int]] = []  # (who, completion tokens so far), in output order
    batch_params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)

    async def consume(name: str, req: GenerationRequest) -> GenerationOutput:
        last = None
        async for out in engine.generate(req):
            events.append((name, out.completion_tokens))
            last = out
        assert last is not None
        return last

    prompt = chat(engine, "Count slowly from one to fifty.")
    batch = [
        asyncio.create_task(
            consume(f"b{i}", GenerationRequest(f"prio-b{i}", prompt, batch_params, priority=1))
        )
        for i in range(2)
    ]
    while sum(1 for who, _ in events if who.startswith("b")) < 4:
        await asyncio.sleep(0.01)  # the batch is decoding
    chat_params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    arrived = len(events)
    answer = await consume("chat", GenerationRequest("prio-chat", prompt, chat_params))
    finals = await asyncio.gather(*batch)
    assert answer.completion_tokens == 6
    assert [f.completion_tokens for f in finals] == [24, 24]
    during = events[arrived : events.index(("chat", 6)) + 1]
    first_chat = next(i for i, (who, _) in enumerate(during) if who == "chat")
    # At most the steps already dispatched when it arrived can still emit batch tokens: the
    # one running, and with the one-step-behind loop also the one whose tokens were being read.
    assert all(who == "chat" for who, _ in during[first_chat:])
    in_flight = 2 if engine.config.pipeline_decode else 1
    assert sum(1 for who, _ in during[:first_chat] if who != "chat") <= 2 * in_flight
