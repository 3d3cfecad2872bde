"""vLLM's sampling extensions on the real SmolLM2-135M-Instruct (fp32, CPU): ``ignore_eos``,
``min_tokens``, ``stop_token_ids``, ``repetition_penalty`` (against a NumPy reference of the
rule on the reference model's logits), ``skip_special_tokens`` and
``include_stop_str_in_output``.

The engine has the small shapes of tests/integration/test_jax_engine.py (so the compiled steps
come from the same on-disk cache), and the module keeps to a few short greedy requests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import numpy as np
import pytest

from local_tier.jax import (
    Engine,
    GenerationOutput,
    GenerationRequest,
    SamplingParams,
    render_chat_prompt,
)
from tests.integration.test_jax_engine import CONFIG  # same small engine: shared compiles

pytestmark = [pytest.mark.model, pytest.mark.anyio]

GREEDY = SamplingParams(temperature=0.0, max_tokens=30)
ANSWER = "The capital of France is Paris."


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[Engine]:
    eng = Engine.from_config(CONFIG)
    await eng.start()
    yield eng
    await eng.stop()


_ids = iter(range(10**6))


def chat(engine: Engine, text: str) -> list[int]:
    prompt = render_chat_prompt(engine.tokenizer, [{"role": "user", "content": text}])
    ids: list[int] = engine.tokenizer.encode(prompt)
    return ids


async def run(engine: Engine, prompt: list[int], **fields: object) -> list[GenerationOutput]:
    params = msgspec.structs.replace(GREEDY, **fields)
    req = GenerationRequest(f"x{next(_ids)}", prompt, params)
    return [o async for o in engine.generate(req)]


def tokens(outs: list[GenerationOutput]) -> list[int]:
    return [t for o in outs for t in o.token_ids]


def text(outs: list[GenerationOutput]) -> str:
    return "".join(o.text for o in outs)


@pytest.fixture(scope="module")
async def france(engine: Engine) -> list[int]:
    return chat(engine, "What is the capital of France?")


@pytest.fixture(scope="module")
async def base(engine: Engine, france: list[int]) -> list[int]:
    """The plain greedy answer's tokens, its final EOS included."""
    outs = await run(engine, france)
    assert text(outs) == ANSWER and outs[-1].finish_reason == "stop"
    ids = tokens(outs)
    assert ids[-1] in engine.tokenizer.eos_token_ids
    return ids


async def test_ignore_eos_gives_exactly_max_tokens(
    engine: Engine, france: list[int], base: list[int]
) -> None:
    n = len(base) + 6
    outs = await run(engine, france, max_tokens=n, ignore_eos=True, skip_special_tokens=False)
    ids = tokens(outs)
    assert outs[-1].finish_reason == "length" and outs[-1].completion_tokens == n == len(ids)
    assert ids[: len(base)] == base  # the model still picks EOS; it just does not stop
    eos = engine.tokenizer.decode([base[-1]], skip_special_tokens=False)
    assert text(outs).startswith(ANSWER + eos)  # skip_special_tokens=False shows it
    assert text(outs) == engine.tokenizer.decode(ids, skip_special_tokens=False)


async def test_min_tokens_holds_eos_back(
    engine: Engine, france: list[int], base: list[int]
) -> None:
    least = len(base) + 2
    outs = await run(engine, france, max_tokens=least + 10, min_tokens=least)
    ids = tokens(outs)
    eos = set(engine.tokenizer.eos_token_ids)
    assert not eos & set(ids[:least])
    assert ids[: len(base) - 1] == base[:-1]  # masking EOS leaves the other choices alone
    assert len(ids) > least
    assert outs[-1].finish_reason == "length" or ids[-1] in eos


async def test_stop_token_ids_end_the_output_without_their_text(
    engine: Engine, france: list[int], base: list[int]
) -> None:
    k = 3
    assert base[k] not in base[:k]
    outs = await run(engine, france, stop_token_ids=(base[k],))
    assert tokens(outs) == base[: k + 1] and outs[-1].finish_reason == "stop"
    assert text(outs) == engine.tokenizer.decode(base[:k])
    kept = await run(engine, france, stop_token_ids=(base[k],), include_stop_str_in_output=True)
    assert text(kept) == engine.tokenizer.decode(base[: k + 1])


async def test_include_stop_str_in_output(engine: Engine, france: list[int]) -> None:
    outs = await run(engine, france, stop=(" Paris",), include_stop_str_in_output=True)
    assert text(outs) == "The capital of France is Paris" and outs[-1].finish_reason == "stop"
    eos = await run(engine, france, include_stop_str_in_output=True, skip_special_tokens=False)
    assert text(eos) == ANSWER + "<|im_end|>"  # an included EOS is text like any stop


async def test_repetition_penalty_changes_greedy_output_as_the_reference_rule(
    engine: Engine,
) -> None:
    from local_tier.jax.gguf_loader import load_gguf
    from local_tier.jax.reference import reference_logits

    prompt = chat(engine, "Say 'dog dog dog dog dog dog'.")
    plain = tokens(await run(engine, prompt, max_tokens=8, ignore_eos=True))
    penalty = 1.8
    outs = await run(engine, prompt, max_tokens=8, ignore_eos=True, repetition_penalty=penalty)
    got = tokens(outs)
    assert got != plain
    logits = reference_logits(load_gguf(), prompt + got[:-1])
    for i, token in enumerate(got):  # CTRL's rule over prompt and output ids so far
        row = logits[len(prompt) - 1 + i].astype(np.float64)
        seen = np.isin(np.arange(row.shape[0]), prompt + got[:i])
        row = np.where(seen, np.where(row > 0, row / penalty, row * penalty), row)
        assert int(np.argmax(row)) == token, f"step {i}"
