"""The JAX engine on Hugging Face folders, against transformers (PyTorch CPU) as the
independent implementation.

``tests/fixtures/hf_reference.py`` runs under ``.vllm-venv`` (torch + transformers; created by
``scripts/setup_vllm.sh``, which the slow stage runs): it saves tiny random-weight Llama 3
(llama3 RoPE scaling, attention biases, sharded), Mistral (sliding window, head_dim apart from
hidden/heads, GQA 4:1), Qwen2 tied (bf16) and Qwen2 untied models with SmolLM2's real
tokenizer, and records transformers' fp32 logits and greedy tokens. Each folder is loaded in
the engine (fp32, few compiled shapes, no warm-up): same prompt ids, logits within 2e-4 at
every step (measured: 1.5e-5 at most, logits up to 15), same greedy tokens. The real
SmolLM2-135M-Instruct folder (bf16, converted from the GGUF by setup_vllm.sh) must render the
same chat prompts as transformers' ``apply_chat_template`` and generate the same greedy tokens
as ``generate``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from local_tier.jax import (
    Engine,
    EngineConfig,
    GenerationRequest,
    SamplingParams,
    render_chat_prompt,
)
from local_tier.jax.scheduler import PrefillItem, Sequence, StepPlan

ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = ROOT / ".vllm-venv" / "bin" / "python"
SMOLLM = ROOT / ".vllm-model" / "smollm2-135m-instruct"
SCRIPT = ROOT / "tests" / "fixtures" / "hf_reference.py"
VARIANTS = ("llama3", "mistral", "qwen2_tied_bf16", "qwen2_untied")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.anyio,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not VENV_PYTHON.exists() or not (SMOLLM / "config.json").exists(),
        reason=".vllm-venv or .vllm-model missing: run `bash scripts/setup_vllm.sh`",
    ),
]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def refs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the transformers side once: model folders and reference outputs."""
    out = tmp_path_factory.mktemp("hf_models")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [str(VENV_PYTHON), str(SCRIPT), str(out), str(SMOLLM), str(SMOLLM)],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    data: dict[str, Any] = json.loads((out / "refs.json").read_text())
    data["dir"] = out
    return data


def config_for(folder: str, max_model_len: int) -> EngineConfig:
    """fp32 (transformers' reference is fp32), three compiled shapes, no warm-up."""
    return EngineConfig(
        model_path=folder,
        dtype="float32",
        max_batch_size=2,
        max_model_len=max_model_len,
        kv_cache_tokens=512,
        block_size=16,
        prefill_chunk_tokens=32,
        max_waiting=4,
        warmup=False,
        decode_batch_buckets=(2,),
        prefill_row_buckets=(1,),
        prefill_len_buckets=(32,),
    )


_ids = iter(range(10**6))


async def generate_ids(engine: Engine, prompt: list[int], params: SamplingParams) -> list[int]:
    req = GenerationRequest(f"hf{next(_ids)}", prompt, params)
    return [t async for out in engine.generate(req) for t in out.token_ids]


def step_logits(engine: Engine, prompt: list[int], forced: list[int]) -> np.ndarray:
    """The engine's logits for the prompt's last token and then for each of ``forced[:-1]``
    fed back by decode steps (rows aligned with transformers'); the prompt is prefilled in
    two chunks, so the second reads the first from the paged cache."""
    runner, pool = engine._runner, engine._sched.pool
    seq = Sequence("logits", prompt, max_tokens=len(forced))
    seq.blocks = [pool.allocate() for _ in range(-(-(len(prompt) + len(forced)) // 16))]
    rows = []
    try:
        split = len(prompt) // 2
        for start, n in ((0, split), (split, len(prompt) - split)):
            _, lg = runner.execute(
                runner.prepare(StepPlan("prefill", [PrefillItem(seq, start, n, True)]))
            )
            seq.num_computed += n
        rows.append(lg[0])
        for token in forced[:-1]:
            seq.output_ids.append(token)
            _, lg = runner.execute(runner.prepare(StepPlan("decode", decode=[seq])))
            seq.num_computed += 1
            rows.append(lg[0])
    finally:
        pool.release(seq.blocks)
    return np.stack(rows)


def test_reference_covers_every_variant(refs: dict[str, Any]) -> None:
    assert sorted(refs["variants"]) == sorted(VARIANTS)


@pytest.mark.parametrize("name", VARIANTS)
async def test_tiny_model_matches_transformers(refs: dict[str, Any], name: str) -> None:
    variant = refs["variants"][name]
    engine = Engine.from_config(config_for(variant["folder"], 128))
    await engine.start()
    try:
        assert engine.max_model_len == variant["max_model_len"]
        for prompt in variant["prompts"]:
            assert engine.tokenizer.encode(prompt["text"]) == prompt["ids"]
            want = np.load(refs["dir"] / prompt["logits"])
            got = step_logits(engine, prompt["ids"], prompt["greedy"])
            np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)
            assert got.argmax(axis=1).tolist() == prompt["greedy"]
            params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
            assert await generate_ids(engine, prompt["ids"], params) == prompt["greedy"]
    finally:
        await engine.stop()


@pytest.fixture(scope="module")
async def smollm() -> AsyncIterator[Engine]:
    engine = Engine.from_config(config_for(str(SMOLLM), 256))
    await engine.start()
    yield engine
    await engine.stop()


async def test_smollm2_chat_template_renders_like_transformers(
    refs: dict[str, Any], smollm: Engine
) -> None:
    for chat in refs["smollm2"]["chats"]:
        rendered = render_chat_prompt(smollm.tokenizer, chat["messages"])
        assert rendered == chat["rendered"]
        assert smollm.tokenizer.encode(rendered) == chat["ids"]


async def test_smollm2_greedy_tokens_match_transformers(
    refs: dict[str, Any], smollm: Engine
) -> None:
    assert refs["smollm2"]["eos_token_id"] in smollm.tokenizer.eos_token_ids
    for chat in refs["smollm2"]["chats"]:
        params = SamplingParams(temperature=0.0, max_tokens=len(chat["greedy"]))
        assert await generate_ids(smollm, chat["ids"], params) == chat["greedy"], chat["rendered"]
