"""Building an engine's parts from ``EngineConfig``: model, tokenizer, cache, scheduler."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from local_tier.jax import backend, sharding
from local_tier.jax import model as M
from local_tier.jax.api import EngineConfig, EngineRequestError, ProgressFn
from local_tier.jax.attention import CHUNK_BLOCKS
from local_tier.jax.buckets import Buckets
from local_tier.jax.compile_plan import PlanSpace, cover, possible_shapes
from local_tier.jax.gguf_loader import GGUFModel, HParams, load_gguf
from local_tier.jax.hf_loader import HFModel, is_hf_folder, load_hf
from local_tier.jax.hf_tokenizer import HFTokenizer
from local_tier.jax.kv_cache import BlockPool
from local_tier.jax.memory import (
    KvPlan,
    device_memory,
    fixed_kv_cache,
    kv_bytes_per_token,
    plan_kv_cache,
    step_activation_bytes,
)
from local_tier.jax.runner import Runner, device_dtype
from local_tier.jax.scheduler import Scheduler
from local_tier.jax.tokenizer import Tokenizer


@dataclass
class Loaded:
    tokenizer: Tokenizer
    runner: Runner
    scheduler: Scheduler
    model_name: str
    max_model_len: int


def check_config(c: EngineConfig) -> None:
    """Reject settings that cannot work, naming the field."""
    positive = (
        "max_batch_size",
        "max_model_len",
        "kv_cache_tokens",
        "block_size",
        "max_waiting",
        "prefill_chunk_tokens",
        "background_prefill_tokens",
        "tensor_parallel",
        "data_parallel",
    )
    for name in positive:
        if getattr(c, name) < 1:
            raise ValueError(f"EngineConfig.{name} must be >= 1")
    if c.kv_cache_tokens < 2 * c.block_size:
        raise ValueError("EngineConfig.kv_cache_tokens must hold at least two blocks")
    if c.kv_cache_fraction is not None and not 0 < c.kv_cache_fraction <= 1:
        raise ValueError("EngineConfig.kv_cache_fraction must be in (0, 1]")


def model_name_for(path: str, fallback: str) -> str:
    """``SmolLM2-135M-Instruct.Q4_1.gguf`` -> ``SmolLM2-135M-Instruct``; a folder's name."""
    stem = re.sub(r"\.gguf$", "", Path(path).name, flags=re.IGNORECASE)
    stem = re.sub(r"[.-](Q\d\w*|F16|F32|BF16|IQ\w+)$", "", stem, flags=re.IGNORECASE)
    return stem or fallback


def prefill_dtype(config: EngineConfig, platform: str) -> str:
    """Weights for prefill steps: as configured, else fp32 on a CPU without native bf16
    matmuls (see ``Runner``), else the decode weights themselves (no second copy)."""
    if config.prefill_dtype is not None:
        return config.prefill_dtype
    if platform == "cpu" and not backend.cpu_has_native_bf16():
        return "float32"
    return config.dtype


def kv_dtype_for(weights_dtype: str) -> str:
    """The default KV cache dtype: the weights' own, bf16 for int8 weights."""
    return "bfloat16" if weights_dtype == "int8" else weights_dtype


def make_buckets(config: EngineConfig, max_len: int, platform: str) -> Buckets:
    """The compiled shapes for this config (see ``buckets.py``)."""
    # bf16 matmuls with a single row take a slow path on XLA:CPU: decode at least two rows.
    # (int8 weights multiply in bf16 too, see quant.py)
    min_batch = 2 if (config.dtype in ("bfloat16", "int8") and platform == "cpu") else 1
    return Buckets.build(
        config.max_batch_size, max_len, config.prefill_chunk_tokens, min_batch, config.block_size
    ).override(config.decode_batch_buckets, config.prefill_row_buckets, config.prefill_len_buckets)


def load_model(path: str | None) -> tuple[GGUFModel | HFModel, Tokenizer]:
    """A folder is a Hugging Face model (``hf_loader``); a file, or None, a GGUF model."""
    if path is not None and is_hf_folder(path):
        hf = load_hf(path)
        return hf, HFTokenizer(hf.tokenizer)
    gguf = load_gguf(path)
    return gguf, Tokenizer(gguf.tokenizer)


def max_model_len(config: EngineConfig, hp: HParams, progress: ProgressFn) -> int:
    """The configured length, capped by the model's context and by its attention window: a
    sliding-window model (Mistral) attends to every earlier token while sequences stay within
    the window, so capping keeps full attention exact without a windowed mask."""
    max_len = min(config.max_model_len, hp.context_length)
    if hp.sliding_window is not None and hp.sliding_window < max_len:
        progress(
            f"max_model_len capped from {max_len} to the model's sliding window "
            f"{hp.sliding_window} (windowed attention is not implemented)"
        )
        max_len = hp.sliding_window
    return max_len


def attention_kernel(config: EngineConfig, platform: str, tp: int) -> str:
    """``ModelSpec.attention`` for ``config.attention`` on ``platform``: "auto" and "xla" are
    the XLA path; "pallas" is the platform's Pallas kernel, refused where none runs (the CPU,
    where Pallas only interprets) or where the cache is split over devices (a custom kernel
    would need ``shard_map``; not built)."""
    if config.attention != "pallas":
        return "xla"
    kernel = {"tpu": "pallas_tpu", "gpu": "pallas_gpu", "cuda": "pallas_gpu"}.get(platform)
    if kernel is None:
        raise ValueError(f"EngineConfig.attention 'pallas' needs a TPU or GPU, not {platform}")
    if tp > 1:
        raise ValueError("EngineConfig.attention 'pallas' works on one device (tensor_parallel 1)")
    return kernel


def device_placement(config: EngineConfig, replica: int = 0) -> sharding.Placement:
    """The devices of data-parallel replica ``replica``: the platform's first
    ``tensor_parallel x data_parallel`` devices, ``tensor_parallel`` consecutive ones each."""
    if not 0 <= replica < config.data_parallel:
        raise ValueError(f"replica {replica} of data_parallel={config.data_parallel}")
    tp = config.tensor_parallel
    devices = backend.select_devices(config.backend, tp * config.data_parallel)
    return sharding.Placement.on(devices[replica * tp : (replica + 1) * tp])


def kv_cache_plan(
    config: EngineConfig,
    hp: HParams,
    buckets: Buckets,
    max_len: int,
    placement: sharding.Placement,
    kv_dtype: Any,
    weights: Any,
) -> KvPlan:
    """The KV cache: ``kv_cache_tokens``, or with ``kv_cache_fraction`` what that share of
    the device's memory leaves after ``weights`` (host arrays, all copies) and the largest
    step's activations (``memory.py``), over the placement's tensor-parallel devices."""
    per_token = kv_bytes_per_token(hp, np.dtype(kv_dtype).itemsize)
    if config.kv_cache_fraction is None:
        return fixed_kv_cache(config.kv_cache_tokens, per_token, config.block_size)
    space = PlanSpace(buckets, config.max_batch_size, config.prefill_chunk_tokens, max_len)
    chunk = CHUNK_BLOCKS * config.block_size
    reserve = max(step_activation_bytes(hp, s, chunk) for s in cover(possible_shapes(space)))
    weight_bytes = sum(int(x.size) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(weights))
    memory = device_memory(placement.device)
    return plan_kv_cache(
        config.kv_cache_fraction,
        memory,
        weight_bytes,
        reserve,
        per_token,
        config.block_size,
        devices=placement.tp,
    )


def load_engine_parts(config: EngineConfig, progress: ProgressFn, replica: int = 0) -> Loaded:
    """The parts of one engine: data-parallel replica ``replica`` (0-based) of
    ``config.data_parallel``, on its own ``tensor_parallel`` devices."""
    check_config(config)
    t0 = time.perf_counter()
    placement = device_placement(config, replica)
    device = placement.device
    cache_dir = backend.enable_compile_cache(config.compile_cache_dir)
    where = ", ".join(str(d) for d in placement.devices)
    progress(f"JAX device: {device.platform} ({where}); compile cache: {cache_dir or 'off'}")
    model, tokenizer = load_model(config.model_path)
    hp = model.hparams
    sharding.check_tensor_parallel(hp, placement.tp)
    progress(f"read {model.path.name} ({hp.n_layers} layers) in {time.perf_counter() - t0:.1f}s")
    max_len = max_model_len(config, hp, progress)
    bs = config.block_size
    buckets = make_buckets(config, max_len, device.platform)
    weights = M.pack_weights(model, device_dtype(config.dtype), placement.tp)
    pre_dtype = prefill_dtype(config, device.platform)
    pre = (
        None
        if pre_dtype == config.dtype
        else M.pack_weights(model, device_dtype(pre_dtype), placement.tp)
    )
    kv_dtype = device_dtype(config.kv_dtype or kv_dtype_for(config.dtype))
    kv = kv_cache_plan(config, hp, buckets, max_len, placement, kv_dtype, (weights, pre))
    progress(kv.report())
    num_blocks = kv.tokens // bs
    attention = attention_kernel(config, device.platform, placement.tp)
    spec = M.ModelSpec(hp, num_blocks + 1, bs, placement.tp, attention)  # + block 0: scratch
    runner = Runner(spec, weights, kv_dtype, buckets, placement, pre, report=progress)
    del weights, pre, model
    scheduler = Scheduler(
        BlockPool(num_blocks, bs),
        buckets,
        config.max_batch_size,
        config.prefill_chunk_tokens,
        background_prefill_budget=config.background_prefill_tokens,
    )
    name = config.model_name or model_name_for(
        config.model_path or "SmolLM2-135M-Instruct", "local-model"
    )
    progress(
        f"model {name} ready on {device.platform} in {time.perf_counter() - t0:.1f}s "
        f"(weights {config.dtype}, prefill {pre_dtype}, KV cache {num_blocks} x {bs} tokens)"
    )
    return Loaded(tokenizer, runner, scheduler, name, max_len)


__all__ = ["EngineRequestError", "Loaded", "check_config", "kv_cache_plan", "load_engine_parts"]
