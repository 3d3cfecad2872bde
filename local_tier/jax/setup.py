"""Building an engine's parts from ``EngineConfig``: model, tokenizer, cache, scheduler."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from local_tier.jax import backend
from local_tier.jax import model as M
from local_tier.jax.api import EngineConfig, EngineRequestError, ProgressFn
from local_tier.jax.buckets import Buckets
from local_tier.jax.gguf_loader import GGUFModel, HParams, load_gguf
from local_tier.jax.hf_loader import HFModel, is_hf_folder, load_hf
from local_tier.jax.hf_tokenizer import HFTokenizer
from local_tier.jax.kv_cache import BlockPool
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
    )
    for name in positive:
        if getattr(c, name) < 1:
            raise ValueError(f"EngineConfig.{name} must be >= 1")
    if c.kv_cache_tokens < 2 * c.block_size:
        raise ValueError("EngineConfig.kv_cache_tokens must hold at least two blocks")


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
    buckets = Buckets.build(
        config.max_batch_size, max_len, config.prefill_chunk_tokens, min_batch, config.block_size
    ).override(
        config.decode_batch_buckets,
        config.prefill_row_buckets,
        config.prefill_len_buckets,
        config.context_buckets,
    )
    if any(p % config.block_size for p in (*buckets.context, *buckets.prefill_ctx)):
        raise ValueError("EngineConfig: context buckets must be multiples of block_size")
    return buckets


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


def load_engine_parts(config: EngineConfig, progress: ProgressFn) -> Loaded:
    check_config(config)
    t0 = time.perf_counter()
    device = backend.select_device(config.backend)
    cache_dir = backend.enable_compile_cache(config.compile_cache_dir)
    progress(f"JAX device: {device.platform} ({device}); compile cache: {cache_dir or 'off'}")
    model, tokenizer = load_model(config.model_path)
    hp = model.hparams
    progress(f"read {model.path.name} ({hp.n_layers} layers) in {time.perf_counter() - t0:.1f}s")
    max_len = max_model_len(config, hp, progress)
    bs = config.block_size
    num_blocks = config.kv_cache_tokens // bs
    spec = M.ModelSpec(hp, num_blocks + 1, bs)  # + block 0: scratch
    buckets = make_buckets(config, max_len, device.platform)
    weights = M.pack_weights(model, device_dtype(config.dtype))
    pre_dtype = prefill_dtype(config, device.platform)
    pre = None if pre_dtype == config.dtype else M.pack_weights(model, device_dtype(pre_dtype))
    kv_dtype = device_dtype(config.kv_dtype or kv_dtype_for(config.dtype))
    runner = Runner(spec, weights, kv_dtype, buckets, device, pre, report=progress)
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


def warmup_shapes(buckets: Buckets, config: EngineConfig) -> list[tuple[int, int, int]]:
    """The shapes worth compiling before serving, i.e. those steady traffic of prompts and
    conversations up to ~500 tokens meets (a shape first met while serving compiles there,
    stalling every stream for 1.5-2.5 s; measured in the local-tier bench as 1.6 s TTFT p95):

    - decode at every batch bucket for contexts up to 512;
    - prefill without context at every (rows, chunk) pair the scheduler can plan (padded
      rows x chunk within the prefill budget);
    - one-row prefill of every chunk after a cached context of up to 1024 tokens: the steps a
      prefix-cache hit and a long prompt's later chunks run."""
    budget = config.prefill_chunk_tokens
    decode = [(b, 1, p) for b in buckets.decode_batch for p in buckets.context if 0 < p <= 512]
    prefill = [
        (r, t, 0)
        for r in buckets.prefill_rows
        for t in buckets.prefill_len
        if r == 1 or r * t <= budget
    ]
    hits = [(1, t, p) for t in buckets.prefill_len for p in buckets.prefill_ctx if 0 < p <= 1024]
    return prefill + hits + decode


__all__ = ["EngineRequestError", "Loaded", "check_config", "load_engine_parts", "warmup_shapes"]
