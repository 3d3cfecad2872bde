"""JAX's Pallas paged-attention kernels, called so that they return the softmax statistics too.

``jax.experimental.pallas.ops.{tpu,gpu}.paged_attention`` return only the attention output;
their kernels also compute each query's running max ``m`` and sum ``l``, and the public
wrappers drop them. The engine needs the log-sum-exp ``m + log(l)`` to merge the cached
context's attention with the step's own new token (``attention_kernels.merge``), so this
module repeats the wrappers' ``pallas_call`` (the no-megacore, unquantized case) around the
unchanged kernel bodies and keeps those outputs. Written against JAX 0.10.2's kernels.

Both kernels take pages ``(kv_heads, total_pages, page_size, head_dim)`` and one page table
per batch row shared by all of its KV heads. ``attention_kernels.fold_heads`` hands them the
engine's cache with one KV head and ``B * Hkv`` rows, so here ``q`` is ``(rows, G, hd)`` and
``k_pages`` is ``(1, pages, page_size, hd)``; nothing below depends on that.

Both kernels apply no softmax scale: ``q`` arrives already scaled by ``1/sqrt(hd)``.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as plgpu
from jax.experimental.pallas.ops.gpu import paged_attention as gpu_pa
from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention_kernel as tpu_pa

F32 = jnp.float32
GPU_BLOCK_H = 16  # the GPU kernel's query-head tile; it must be a multiple of 16


def _shape(shape: tuple[int, ...]) -> Any:
    """An fp32 output of ``shape`` for ``pallas_call``."""
    return cast(Any, jax.ShapeDtypeStruct)(shape, F32)


def divisor_at_most(n: int, cap: int, pow2: bool = False) -> int:
    """The largest divisor of ``n >= 1`` that is ``<= max(cap, 1)`` (and, with ``pow2``, a
    power of two)."""
    ok = [d for d in range(1, min(n, max(cap, 1)) + 1) if n % d == 0]
    return max(d for d in ok if not pow2 or d & (d - 1) == 0)


def tpu_paged_attention(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    lengths: jax.Array,
    page_table: jax.Array,
    *,
    interpret: bool = False,
    block_tokens: int = 512,
) -> tuple[jax.Array, jax.Array]:
    """The TPU kernel over ``q`` (rows, G, hd), pages (Hkv, N, bs, hd), ``lengths`` (rows,)
    int32 and ``page_table`` (rows, pps) int32. Returns the normalized output (rows, Hkv*G, hd)
    fp32 and the log-sum-exp (rows, Hkv*G) fp32 (-inf for a row of length 0).

    The kernel reads pages in compute blocks of ``pages_per_compute_block`` pages, which must
    divide ``pps``: the largest such block of at most ``block_tokens`` tokens is used. It
    loads K/V as bf16 whatever the cache dtype (its ``_maybe_dequantize`` casts to bf16), so
    an fp32 cache is attended at bf16 precision. ``interpret``: TPU interpret mode (CPU)."""
    rows, n_q, hd = q.shape
    hkv, _, page_size, _ = k_pages.shape
    g = n_q // hkv
    pps = page_table.shape[1]
    per_block = divisor_at_most(pps, block_tokens // page_size)
    if g % 8:
        # As the upstream wrapper: a (G, 1, hd) block keeps Mosaic off an (8, 128) layout.
        q = q.reshape(rows, n_q, 1, hd).astype(F32)
        spec = pl.BlockSpec((None, g, None, hd), lambda c, b, h, *_: (b, h, 0, 0))
    else:
        spec = pl.BlockSpec((None, g, hd), lambda c, b, h, *_: (b, h, 0))

    def buf(pages: jax.Array) -> Any:
        return pltpu.VMEM((2, per_block, page_size, hd), pages.dtype)  # double-buffered DMA

    kernel = functools.partial(
        tpu_pa.paged_flash_attention_kernel_inline_seq_dim,
        pages_per_sequence=pps,
        batch_size=rows,
        pages_per_compute_block=per_block,
        mask_value=tpu_pa.DEFAULT_MASK_VALUE,
        attn_logits_soft_cap=None,
        megacore_mode=None,
    )
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    stat = _shape((*q.shape[:-1], 1))
    out, maxes, sums = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4,  # lengths, page table, buffer index, init flag
            in_specs=[spec, any_spec, None, any_spec, None],
            out_specs=[spec, spec, spec],
            grid=(1, rows, hkv),
            scratch_shapes=(
                buf(k_pages),
                None,
                buf(v_pages),
                None,
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.SemaphoreType.DMA((2,)),
            ),
        ),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary")
        ),
        out_shape=[_shape(q.shape), stat, stat],
        interpret=pltpu.InterpretParams() if interpret else False,
    )(
        lengths,
        page_table.reshape(-1),
        jnp.zeros((1,), jnp.int32),
        jnp.ones((1,), jnp.int32),
        q,
        k_pages,
        None,
        v_pages,
        None,
    )
    # The kernel writes the stats as (G, hd) blocks into (G, 1) arrays: column 0 is kept.
    maxes, sums = maxes.reshape(rows, n_q, -1)[..., 0], sums.reshape(rows, n_q, -1)[..., 0]
    return out.reshape(rows, n_q, hd), maxes + jnp.log(sums)


def _gpu_row(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    table: jax.Array,
    length: jax.Array,
    *,
    k_splits: int,
    per_block: int,
    interpret: bool,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One row through the GPU kernel, as ``paged_attention_unbatched`` does, but returning
    each split's unnormalized output (k_splits, Hkv, G, hd) with its ``l`` and ``m``."""
    n_q, hd = q.shape
    hkv, n_pages, page_size, _ = k_pages.shape
    g = n_q // hkv
    qr = q.reshape(hkv, g, hd)
    pad = -g % GPU_BLOCK_H
    if pad:
        qr = jnp.pad(qr, ((0, 0), (0, pad), (0, 0)))
    kernel = functools.partial(
        gpu_pa.paged_attention_kernel,
        num_heads=g,
        pages_per_compute_block=per_block,
        mask_value=gpu_pa.DEFAULT_MASK_VALUE,
        attn_logits_soft_cap=None,
    )
    page_spec = pl.BlockSpec((None, n_pages, page_size, hd), lambda h, i, k: (h, 0, 0, 0))
    stat_spec = pl.BlockSpec((None, None, GPU_BLOCK_H), lambda h, i, k: (k, h, i))
    stat = _shape((k_splits, *qr.shape[:-1]))
    o, sums, maxes = pl.pallas_call(
        kernel,
        grid=(hkv, qr.shape[1] // GPU_BLOCK_H, k_splits),
        in_specs=[
            pl.BlockSpec((None, GPU_BLOCK_H, hd), lambda h, i, k: (h, i, 0)),
            page_spec,
            None,
            page_spec,
            None,
            pl.BlockSpec((None, table.shape[0] // k_splits), lambda h, i, k: (k, 0)),
            pl.BlockSpec((1,), lambda h, i, k: (0,)),
        ],
        out_specs=[
            pl.BlockSpec((None, None, GPU_BLOCK_H, hd), lambda h, i, k: (k, h, i, 0)),
            stat_spec,
            stat_spec,
        ],
        # fp32 partial outputs (upstream keeps q's dtype), so bf16 rounds once, at the end.
        out_shape=[_shape((k_splits, *qr.shape)), stat, stat],
        interpret=interpret,
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
    )(qr, k_pages, None, v_pages, None, table.reshape(k_splits, -1), length)
    return o[:, :, :g], sums[:, :, :g], maxes[:, :, :g]


def gpu_paged_attention(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    lengths: jax.Array,
    page_table: jax.Array,
    *,
    interpret: bool = False,
    max_splits: int = 16,
    max_pages_per_block: int = 8,
) -> tuple[jax.Array, jax.Array]:
    """The GPU (Triton) kernel, same arguments and results as ``tpu_paged_attention``.

    Each row's pages are cut into ``k_splits`` partitions processed in parallel (the largest
    divisor of ``pps`` up to ``max_splits``), each in compute blocks of the largest divisor of
    the partition up to ``max_pages_per_block`` pages, a power of two as Triton's tiles must
    be (``page_size`` and ``hd`` must be too, on a GPU); the partitions' (output, m, l) are
    combined here. ``interpret``: Pallas' generic interpreter (CPU)."""
    rows, n_q, hd = q.shape
    pps = page_table.shape[1]
    k_splits = divisor_at_most(pps, max_splits)
    per_block = divisor_at_most(pps // k_splits, max_pages_per_block, pow2=True)
    row = functools.partial(_gpu_row, k_splits=k_splits, per_block=per_block, interpret=interpret)
    o, sums, maxes = jax.vmap(row, (0, None, None, 0, 0))(
        q, k_pages, v_pages, page_table, lengths[:, None]
    )
    o = o.reshape(rows, k_splits, n_q, hd)
    sums, maxes = sums.reshape(rows, k_splits, n_q), maxes.reshape(rows, k_splits, n_q)
    # Partition k's output is sum(exp(s - maxes_k) v) and its weight sums_k; an empty
    # partition has sums 0 and maxes float32 min, so it adds nothing.
    top = maxes.max(axis=1, keepdims=True)
    w = jnp.exp(maxes - top)
    total = (sums * w).sum(axis=1)
    out = (o * w[..., None]).sum(axis=1) / jnp.where(total > 0, total, 1.0)[..., None]
    return out, top[:, 0] + jnp.log(total)
