"""int8 weights on the real SmolLM2-135M-Instruct against bf16 (CPU): greedy answers, greedy
token agreement, and the perplexity of a fixed text computed from the compiled step's logits.

Engines use the small shapes of test_jax_engine.py (decode at 2 and 4 rows, two-row prefill
chunks of 32 tokens, contexts padded to 256); the perplexity runs one step of 48 rows over the
same text, row ``i`` returning the logits at position ``i``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import jax.numpy as jnp
import msgspec
import numpy as np
import pytest

from local_tier.jax import (
    Engine,
    GenerationRequest,
    SamplingParams,
    render_chat_prompt,
)
from local_tier.jax import model as M
from local_tier.jax.gguf_loader import load_gguf
from local_tier.jax.tokenizer import Tokenizer
from tests.integration.test_jax_engine import CONFIG

pytestmark = [pytest.mark.model, pytest.mark.anyio]

N_TOKENS = 16
# Measured: tokens equal to bf16's before the first difference [16, 16, 16, 13, 14, 16].
AGREE_TOKENS, AGREE_PROMPTS = 8, 5
QUESTIONS = [
    "What is the capital of France?",
    "What is 2 + 2?",
    "Name the largest planet in the solar system.",
    "Who wrote Romeo and Juliet?",
    "What color is the sky on a clear day?",
    "Give me one word that rhymes with cat.",
]
TEXT = (
    "The river runs through the old town, past the market and the stone bridge. In the "
    "morning, farmers bring vegetables and bread to sell, and children walk to school "
    "along the water. In the evening, the lights of the houses shine on the river."
)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


async def greedy_answers(dtype: str) -> list[list[int]]:
    engine = Engine.from_config(msgspec.structs.replace(CONFIG, dtype=dtype))
    await engine.start()
    try:
        out = []
        for i, q in enumerate(QUESTIONS):
            msgs = [{"role": "user", "content": q}]
            prompt = engine.tokenizer.encode(render_chat_prompt(engine.tokenizer, msgs))
            params = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, ignore_eos=True)
            req = GenerationRequest(f"{dtype}-{i}", prompt, params)
            out.append([t async for o in engine.generate(req) for t in o.token_ids])
        return out
    finally:
        await engine.stop()


@pytest.fixture(scope="module")
async def answers() -> AsyncIterator[dict[str, list[list[int]]]]:
    yield {d: await greedy_answers(d) for d in ("bfloat16", "int8")}


def perplexity(dtype: Any) -> float:
    """exp(mean NLL) of TEXT's tokens from the compiled step's logits (bf16 KV cache)."""
    model = load_gguf(None)
    ids = Tokenizer(model.tokenizer).encode(TEXT)
    n = len(ids)
    spec = M.ModelSpec(model.hparams, n_blocks=2, block_size=16)
    k, v = M.new_cache(spec, jnp.bfloat16)
    rows = n - 1  # row i predicts token i + 1 from the logits at position i
    inputs = M.StepInputs(  # padding K/V writes all go to the scratch block 0
        tokens=np.tile(np.asarray(ids, np.int32), (rows, 1)),
        positions=np.tile(np.arange(n, dtype=np.int32), (rows, 1)),
        n_new=np.full(rows, n, np.int32),
        ctx_blocks=np.zeros((rows, 0), np.int32),
        ctx_len=np.zeros(rows, np.int32),
        write_blocks=np.zeros((rows, n), np.int32),
        write_offsets=np.zeros((rows, n), np.int32),
    )
    logits, _, _, _ = M.make_step(spec)(
        M.pack_weights(model, dtype), k, v, inputs, np.arange(rows, dtype=np.int32)
    )
    lg = np.asarray(logits, np.float64)
    logp = lg - lg.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    return float(np.exp(-logp[np.arange(rows), ids[1:]].mean()))


async def test_int8_answers_the_reference_questions(answers: dict[str, list[list[int]]]) -> None:
    tok = Tokenizer(load_gguf(None).tokenizer)
    text = tok.decode(answers["int8"][0])
    assert "Paris" in text, text
    assert "4" in tok.decode(answers["int8"][1])
    # (question 2: bf16 and int8 both say "Neptune"; the 135M model gets it wrong either way)
    assert "Shakespeare" in tok.decode(answers["int8"][3])


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


async def test_int8_greedy_tokens_follow_bf16(answers: dict[str, list[list[int]]]) -> None:
    """The first tokens agree with bf16's on most prompts (greedy paths may part later, where
    two candidates are near-tied)."""
    pairs = zip(answers["bfloat16"], answers["int8"], strict=True)
    prefixes = [common_prefix(a, b) for a, b in pairs]
    print(f"tokens equal to bf16's before the first difference: {prefixes}")
    assert sum(p >= AGREE_TOKENS for p in prefixes) >= AGREE_PROMPTS


def test_int8_perplexity_is_close_to_bf16() -> None:
    bf16, int8 = perplexity(jnp.bfloat16), perplexity(jnp.int8)
    # measured: bf16 27.007, int8 27.029 (+0.08%)
    print(f"perplexity bf16 {bf16:.3f} int8 {int8:.3f} ({100 * (int8 / bf16 - 1):+.2f}%)")
    assert 1 < bf16 < 100
    assert abs(int8 / bf16 - 1) < 0.02
