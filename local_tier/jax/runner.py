"""Turns a ``StepPlan`` into padded device inputs, runs the compiled step, returns logits.

Owns the device state: weights and the two KV cache arrays (donated to every step, so XLA
updates them in place). ``prepare`` (host, cheap) and ``execute`` (device) are separate so the
engine can run ``execute`` in a worker thread while its event loop stays responsive.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from local_tier.jax import model as M
from local_tier.jax.buckets import Buckets, round_up
from local_tier.jax.scheduler import Sequence, StepPlan

I32 = np.int32


@dataclass
class Batch:
    """Host arrays for one step, plus which rows need their logits sampled."""

    inputs: M.StepInputs
    logit_index: np.ndarray
    rows: int  # real rows (the rest is padding)


class Runner:
    """Device weights + KV cache + the compiled step.

    ``prefill_weights`` (optional) serve prefill steps: on a CPU without native bf16, XLA's
    bf16 matmuls are 1.5x faster than fp32 for few-row decode (half the bytes) but 1.5x slower
    for many-row prefill (conversion-bound), so the default there keeps an fp32 copy for
    prefill. Where the CPU has bf16 instructions (AVX512-BF16), bf16 prefill is the faster one
    (1.1-1.55x) and no copy is kept.
    """

    def __init__(
        self,
        spec: M.ModelSpec,
        weights: M.Weights,
        kv_dtype: Any,
        buckets: Buckets,
        device: Any,
        prefill_weights: M.Weights | None = None,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.spec = spec
        self.block_size = spec.block_size
        self.buckets = buckets
        self.device = device
        self.weights = jax.device_put(weights, device)
        self.prefill_weights = (
            self.weights if prefill_weights is None else jax.device_put(prefill_weights, device)
        )
        self.k_cache, self.v_cache = M.new_cache(spec, kv_dtype, device)
        self._step = M.make_step(spec)
        self._report = report or (lambda _msg: None)
        self._shapes_run: set[tuple[int, ...]] = set()  # compiled (or loaded) step shapes

    def _blocks(self, seq: Sequence, n_tokens: int, width: int) -> np.ndarray:
        """The block table covering the first ``n_tokens`` of ``seq``, padded to ``width``
        entries with the scratch block 0."""
        out = np.zeros(width, I32)
        used = -(-n_tokens // self.block_size)
        out[:used] = seq.blocks[:used]
        return out

    def _where(self, seq: Sequence, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(block, offset) of positions ``start..stop-1`` of ``seq``."""
        pos = np.arange(start, stop)
        return np.asarray(seq.blocks, I32)[pos // self.block_size], (pos % self.block_size)

    @property
    def decode_weight_bytes(self) -> int:
        """Bytes of the weights a decode step multiplies with (every array read once; int8
        matrices count their int8 bytes plus their fp32 scales)."""
        return sum(int(a.size) * a.dtype.itemsize for a in jax.tree_util.tree_leaves(self.weights))

    def prepare(self, plan: StepPlan) -> Batch:
        if plan.kind == "decode":
            return self._prepare_decode(plan.decode)
        return self._prepare_prefill(plan)

    def _prepare_decode(self, seqs: list[Sequence]) -> Batch:
        b = round_up(len(seqs), self.buckets.decode_batch)
        p = round_up(max(s.num_computed for s in seqs), self.buckets.context)
        arrs = _zeros(b, 1, p // self.block_size)
        for r, s in enumerate(seqs):
            n = s.num_computed
            arrs["tokens"][r, 0] = s.all_ids[n]
            arrs["positions"][r, 0] = n
            arrs["n_new"][r] = 1
            arrs["ctx_blocks"][r] = self._blocks(s, n, p // self.block_size)
            arrs["ctx_len"][r] = n
            arrs["write_blocks"][r], arrs["write_offsets"][r] = self._where(s, n, n + 1)
        return Batch(M.StepInputs(**arrs), np.zeros(b, I32), len(seqs))

    def _prepare_prefill(self, plan: StepPlan) -> Batch:
        items = plan.prefill
        b = round_up(len(items), self.buckets.prefill_rows)
        t = round_up(max(i.length for i in items), self.buckets.prefill_len)
        p = round_up(max(i.start for i in items), self.buckets.prefill_ctx)
        arrs = _zeros(b, t, p // self.block_size)
        last = np.zeros(b, I32)
        for r, it in enumerate(items):
            s, n, end = it.seq, it.length, it.start + it.length
            arrs["tokens"][r, :n] = s.all_ids[it.start : end]
            arrs["positions"][r] = np.arange(it.start, it.start + t)
            arrs["n_new"][r] = n
            arrs["ctx_blocks"][r] = self._blocks(s, it.start, p // self.block_size)
            arrs["ctx_len"][r] = it.start
            arrs["write_blocks"][r, :n], arrs["write_offsets"][r, :n] = self._where(
                s, it.start, end
            )
            last[r] = n - 1
        return Batch(M.StepInputs(**arrs), last, len(items))

    def execute(self, batch: Batch, want_logits: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Run the step; returns (argmax ids (rows,), logits (rows, vocab) or empty).

        A shape outside the warm-up set compiles here, stalling every running stream for
        seconds; each such compile is reported, so a bucket missing from the warm-up shows."""
        shape = (*batch.inputs.tokens.shape, batch.inputs.ctx_blocks.shape[1] * self.block_size)
        if shape in self._shapes_run:
            return self._execute(batch, want_logits)
        t0 = time.perf_counter()
        out = self._execute(batch, want_logits)
        self._shapes_run.add(shape)
        b, t, p = shape
        self._report(f"compiled step B={b} T={t} ctx={p} in {time.perf_counter() - t0:.1f}s")
        return out

    def _execute(self, batch: Batch, want_logits: bool) -> tuple[np.ndarray, np.ndarray]:
        inputs, li = self._put((batch.inputs, batch.logit_index))
        w = self.weights if batch.inputs.tokens.shape[1] == 1 else self.prefill_weights
        logits, top, self.k_cache, self.v_cache = self._step(
            w, self.k_cache, self.v_cache, inputs, li
        )
        ids = np.asarray(top)[: batch.rows]
        out = np.asarray(logits)[: batch.rows] if want_logits else np.empty((0, 0), np.float32)
        return ids, out

    def _put(self, host: Any) -> Any:
        """Place a step's host inputs (a pytree of arrays) where the step reads them."""
        return jax.device_put(host, self.device)

    def warmup(self, shapes: list[tuple[int, int, int]]) -> None:
        """Compile (or load from the persistent cache) each (batch, new tokens, context) shape
        by running it once on scratch slots; each compile is reported like any other."""
        for b, t, p in shapes:
            arrs = _zeros(b, t, p // self.block_size)
            arrs["n_new"][:] = t
            self.execute(Batch(M.StepInputs(**arrs), np.zeros(b, I32), b), want_logits=False)


def _zeros(b: int, t: int, nb: int) -> dict[str, np.ndarray]:
    """Padding everywhere: token 0 written to the scratch block 0, no context."""
    return {
        "tokens": np.zeros((b, t), I32),
        "positions": np.zeros((b, t), I32),
        "n_new": np.zeros(b, I32),
        "ctx_blocks": np.zeros((b, nb), I32),
        "ctx_len": np.zeros(b, I32),
        "write_blocks": np.zeros((b, t), I32),
        "write_offsets": np.zeros((b, t), I32),
    }


def device_dtype(name: str) -> Any:
    """``"float32"`` / ``"bfloat16"`` / ``"int8"`` (quantized weights, ``quant.py``) -> the jnp
    dtype."""
    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "int8": jnp.int8}[name]
