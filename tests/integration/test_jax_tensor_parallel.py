"""Tensor and data parallelism on 8 virtual CPU devices: the real engine split over 2 and 4
devices (and 2 replicas x 2 devices, and int8 over 2) gives one device's greedy tokens, and
the compiled step's logits agree within fp32 rounding.

JAX reads ``--xla_force_host_platform_device_count`` once, when its CPU backend starts, so the
work runs in a fresh interpreter (``python -m`` this module) that writes its findings as JSON;
the tests here assert on them. The model is a tiny random Qwen2-style folder (Q/K/V biases,
untied embeddings, llama3 RoPE: ``tests/unit/test_hf_loader.py``) with 8 heads and 4 KV heads,
so 2 and 4 devices both get whole heads.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
DEVICES = 8
SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
}
# Engines: name -> EngineConfig changes. Each compiles two or three small step shapes.
RUNS: dict[str, dict[str, Any]] = {
    "tp1": {},
    "tp2": {"tensor_parallel": 2},
    "tp4": {"tensor_parallel": 4},
    "dp2_tp2": {"tensor_parallel": 2, "data_parallel": 2},
    "int8_tp1": {"dtype": "int8"},
    "int8_tp2": {"dtype": "int8", "tensor_parallel": 2},
}
PROMPTS = [[1, 3, 4, 5], [1, 6, 7, 8, 9, 10, 11], [1, 12, 13], [1, 5, 6, 7, 20, 21, 22, 23, 24]]
NEW_TOKENS = 8


def run_child(args: list[str], devices: int, timeout: float) -> dict[str, Any]:
    """Run this module in a fresh interpreter with ``devices`` virtual CPU devices."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run(
        [sys.executable, "-m", "tests.integration.test_jax_tensor_parallel", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        check=False,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    found: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("tp") / "tiny"
    return run_child(["tiny", str(folder)], DEVICES, timeout=240)


def test_the_child_sees_eight_devices_and_keeps_the_cpu_flags(tiny: dict[str, Any]) -> None:
    assert tiny["devices"] == DEVICES
    assert "--xla_cpu_copy_insertion_use_region_analysis=true" in tiny["xla_flags"]
    assert "--xla_force_host_platform_device_count=8" in tiny["xla_flags"]


@pytest.mark.parametrize("name", ["tp2", "tp4", "dp2_tp2"])
def test_greedy_tokens_equal_one_devices(tiny: dict[str, Any], name: str) -> None:
    assert tiny["tokens"]["tp1"][0]  # the reference generated something
    assert tiny["tokens"][name] == tiny["tokens"]["tp1"]


def test_int8_split_over_two_devices_equals_int8_on_one(tiny: dict[str, Any]) -> None:
    assert tiny["tokens"]["int8_tp2"] == tiny["tokens"]["int8_tp1"]


def test_data_parallel_replicas_each_served_requests(tiny: dict[str, Any]) -> None:
    assert tiny["replica_finished"] == [2, 2]  # 4 concurrent requests, least-busy routing


@pytest.mark.parametrize("tp", [2, 4])
def test_step_logits_agree_within_fp32_rounding(tiny: dict[str, Any], tp: int) -> None:
    for phase in ("prefill", "decode"):  # decode reads the context back from the split cache
        base = np.asarray(tiny["logits"]["1"][phase])
        got = np.asarray(tiny["logits"][str(tp)][phase])
        assert np.abs(base).max() > 1.0  # not vacuous
        np.testing.assert_allclose(got, base, atol=1e-4, rtol=0)


def test_weights_stay_split_and_only_partial_sums_travel(tiny: dict[str, Any]) -> None:
    """Each device holds 1/tp of the split matrices, and the compiled step all-reduces the
    row-parallel outputs (two per layer) but never gathers weights."""
    hlo = tiny["hlo"]
    assert hlo["all-gather"] == 0
    assert hlo["all-reduce"] == 2 * 2  # 2 layers
    assert tiny["shards"] == {
        "w_qkv": [64, (8 + 4 + 4) * 8 // 2],
        "w_o": [8 * 8 // 2, 64],
        "w_gu": [64, 2 * 64 // 2],
        "w_down": [64 // 2, 64],
        "k_cache": [tiny["cache_rows"], 2, 8, 8],
        "emb_t": [64, 32],
    }
    assert tiny["cache_sharding_kept"] is True


@pytest.mark.model
def test_smollm2_split_over_three_devices_answers_like_one() -> None:
    found = run_child(["smollm2"], 3, timeout=300)
    assert len(found["tp1"]) == NEW_TOKENS
    assert found["tp3"] == found["tp1"]
    assert "Paris" in found["tp3_text"]


# ------------------------------------------------------------------ the child process


def _engine_config(folder: str | None, **change: Any) -> Any:
    """A small engine: few compiled shapes, no warm-up, no compile cache."""
    from local_tier.jax.api import EngineConfig

    fields: dict[str, Any] = {
        "model_path": folder,
        "dtype": "float32",
        "backend": "cpu",
        "max_batch_size": 4,
        "max_model_len": 32,
        "kv_cache_tokens": 256,
        "block_size": 8,
        "prefill_chunk_tokens": 16,
        "compile_cache_dir": "",
        "warmup": False,
        "decode_batch_buckets": (4,),
        "prefill_row_buckets": (2,),
        "prefill_len_buckets": (16,),
    }
    return EngineConfig(**(fields | change))


async def _greedy(engine: Any, prompts: list[list[int]], n: int) -> list[list[int]]:
    from local_tier.jax.api import GenerationRequest, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)

    async def one(i: int, ids: list[int]) -> list[int]:
        outs = [o async for o in engine.generate(GenerationRequest(f"r{i}", ids, params))]
        return [t for o in outs for t in o.token_ids]

    await engine.start()
    try:
        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
    finally:
        await engine.stop()


def _step_logits(model: Any, tp: int) -> tuple[dict[str, list[float]], Any]:
    """Logits of a 12-token prefill and of one decode step after it (fp32), on ``tp``
    devices; returns them and (step, arguments) for inspecting the compiled step."""
    import jax
    import jax.numpy as jnp

    from local_tier.jax import model as M
    from local_tier.jax import sharding

    bs, n = 8, 12
    place = sharding.Placement.on(jax.devices()[:tp])
    spec = M.ModelSpec(model.hparams, n_blocks=4, block_size=bs, tp=tp)
    k, v = M.new_cache(spec, jnp.float32, place.cache)
    w = place.put_weights(M.pack_weights(model, jnp.float32, tp))
    step = M.make_step(spec)
    pos = np.arange(n + 1, dtype=np.int32)
    prefill = M.StepInputs(
        tokens=np.asarray([[1, *range(3, 3 + n - 1)]], np.int32),
        positions=pos[None, :n],
        n_new=np.asarray([n], np.int32),
        ctx_blocks=np.zeros((1, 0), np.int32),
        ctx_len=np.zeros(1, np.int32),
        write_blocks=(1 + pos[None, :n] // bs),
        write_offsets=pos[None, :n] % bs,
    )
    args = jax.device_put((prefill, np.asarray([n - 1], np.int32)), place.replicated)
    first, _, k, v = step(w, k, v, *args)
    decode = M.StepInputs(
        tokens=np.asarray([[20]], np.int32),
        positions=np.asarray([[n]], np.int32),
        n_new=np.asarray([1], np.int32),
        ctx_blocks=np.asarray([[1, 2]], np.int32),
        ctx_len=np.asarray([n], np.int32),
        write_blocks=np.asarray([[1 + n // bs]], np.int32),
        write_offsets=np.asarray([[n % bs]], np.int32),
    )
    dargs = jax.device_put((decode, np.zeros(1, np.int32)), place.replicated)
    second, _, k, v = step(w, k, v, *dargs)
    logits = {"prefill": np.asarray(first)[0].tolist(), "decode": np.asarray(second)[0].tolist()}
    return logits, (step, w, k, v, dargs)


def _layout(model: Any) -> dict[str, Any]:
    """Shard shapes on 2 devices, the collectives of the compiled step, and whether the
    caches a step returns keep the sharding they were created with."""
    import jax

    from local_tier.jax import sharding

    place = sharding.Placement.on(jax.devices()[:2])
    _, (step, w, k, v, dargs) = _step_logits(model, 2)
    text = step.lower(w, k, v, *dargs).compile().as_text()
    ops = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
    layer = w.layers[0]

    def shard(a: Any) -> list[int]:
        return list(a.addressable_shards[0].data.shape)

    return {
        "hlo": {op: len(re.findall(rf"\s{op}(?:-start)?\(", text)) for op in ops},
        "shards": {
            "w_qkv": shard(layer.w_qkv),
            "w_o": shard(layer.w_o),
            "w_gu": shard(layer.w_gu),
            "w_down": shard(layer.w_down),
            "k_cache": shard(k),
            "emb_t": shard(w.emb_t),
        },
        "cache_rows": int(k.shape[0]),
        # jit keys its compiled steps on the inputs' shardings: the caches a step returns
        # must be spelled as the ones it was given, or every step after the first recompiles
        "cache_sharding_kept": k.sharding == place.cache and v.sharding == place.cache,
    }


def _tiny_child(folder: str) -> dict[str, Any]:
    import jax

    from local_tier.jax.hf_loader import load_hf
    from local_tier.jax.replicas import Replicas, build_engine
    from tests.unit.test_hf_loader import tiny_config, tiny_tensors, write_folder

    cfg = tiny_config(**SHAPE)
    write_folder(Path(folder), cfg, tiny_tensors(cfg, seed=5))
    found: dict[str, Any] = {
        "devices": len(jax.devices()),
        "xla_flags": os.environ["XLA_FLAGS"],
        "tokens": {},
    }
    for name, change in RUNS.items():
        engine = build_engine(_engine_config(folder, **change))
        found["tokens"][name] = asyncio.run(_greedy(engine, PROMPTS, NEW_TOKENS))
        if isinstance(engine, Replicas):
            found["replica_finished"] = [e.stats().requests_finished_total for e in engine.engines]
    model = load_hf(folder)
    found["logits"] = {str(tp): _step_logits(model, tp)[0] for tp in (1, 2, 4)}
    found |= _layout(model)
    return found


def _smollm2_child() -> dict[str, Any]:
    from local_tier.jax.engine import Engine
    from local_tier.jax.tokenizer import render_chat_prompt

    found: dict[str, Any] = {}
    for name, tp in (("tp1", 1), ("tp3", 3)):
        config = _engine_config(
            None,
            tensor_parallel=tp,
            max_model_len=128,
            kv_cache_tokens=512,
            prefill_chunk_tokens=64,
            prefill_len_buckets=(64,),
        )
        engine = Engine.from_config(config)
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        ids = engine.tokenizer.encode(render_chat_prompt(engine.tokenizer, msgs))
        found[name] = asyncio.run(_greedy(engine, [ids], NEW_TOKENS))[0]
        found[f"{name}_text"] = engine.tokenizer.decode(found[name])
    return found


if __name__ == "__main__":
    from local_tier.jax import backend  # noqa: F401  (merges the CPU flags before JAX starts)

    result = _tiny_child(sys.argv[2]) if sys.argv[1] == "tiny" else _smollm2_child()
    print(json.dumps(result))
