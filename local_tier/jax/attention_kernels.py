"""Decode attention (one new token per row) over the engine's paged KV cache, by platform.

``decode_attention`` computes what ``model._attention`` computes for a decode step (T = 1):
each row's query attends to its cached context (block table + length) and to its own new
K/V. The context part runs on one of:

- ``"xla"``: plain JAX (gather the row's blocks, masked softmax), the CPU path;
- ``"pallas_tpu"``: JAX's Pallas TPU paged-attention kernel (``pallas_paged.py``);
- ``"pallas_gpu"``: JAX's Pallas GPU (Triton) paged-attention kernel;
- ``"auto"``: ``pallas_tpu`` on TPU, ``pallas_gpu`` on a CUDA GPU, ``xla`` elsewhere.

Layout. The engine's cache is ``(n_layers * n_blocks, Hkv, bs, hd)`` per K and V; both
kernels want ``(Hkv, pages, bs, hd)`` with one page table per row shared by its KV heads.
Instead of transposing (a copy of the whole layer's cache every step), ``fold_heads`` views
the cache as ONE kv head over ``n_layers * n_blocks * Hkv`` pages (a free reshape: each
(block, head) tile is already a contiguous ``(bs, hd)`` page) and gives each (row, kv head)
pair its own page table, ``(block + layer * n_blocks) * Hkv + head``. The kernels then see
``B * Hkv`` rows of ``G`` query heads: the same grid as ``B`` rows of ``Hkv`` heads; the only
per-step cost is a ``(B * Hkv, pps)`` int32 table and a reshape of ``q``.

New token. The engine writes the step's K/V only after all layers, so the kernels (which read
the cache only) see the context alone. Their output and log-sum-exp are merged with the new
token's (``merge``); this keeps the engine's single post-layer scatter. Passing no
``k_new``/``v_new`` gives the context-only result, for a caller that writes first.
"""

from __future__ import annotations

import functools
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from local_tier.jax.pallas_paged import gpu_paged_attention, tpu_paged_attention

F32 = jnp.float32
Kernel = Literal["auto", "xla", "pallas_tpu", "pallas_gpu"]
KERNELS: tuple[str, ...] = ("auto", "xla", "pallas_tpu", "pallas_gpu")
_AUTO = {"tpu": "pallas_tpu", "gpu": "pallas_gpu", "cuda": "pallas_gpu"}


class Partial(NamedTuple):
    """Attention of each query over some subset of its keys.

    ``out`` (..., hd) fp32 is the softmax-weighted mean of those keys' values; ``lse`` (...)
    fp32 is the log-sum-exp of their scaled scores (``-inf`` for an empty subset, whose
    ``out`` is then ignored)."""

    out: jax.Array
    lse: jax.Array


def resolve_kernel(kernel: str, platform: str | None = None) -> str:
    """The concrete kernel for ``kernel`` on ``platform`` (default: JAX's default backend).
    ``"auto"``: tpu -> ``pallas_tpu``, gpu/cuda -> ``pallas_gpu``, anything else -> ``xla``."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown attention kernel {kernel!r}; expected one of {KERNELS}")
    if kernel != "auto":
        return kernel
    return _AUTO.get(platform or jax.default_backend(), "xla")


def merge(a: Partial, b: Partial) -> Partial:
    """Attention over the union of two disjoint key sets from each set's attention: the
    softmax over all keys, rebuilt from per-set (output, log-sum-exp)."""
    top = jnp.maximum(a.lse, b.lse)
    top = jnp.where(jnp.isfinite(top), top, 0.0)  # both empty: weights 0, no inf - inf
    wa, wb = jnp.exp(a.lse - top), jnp.exp(b.lse - top)
    total = wa + wb
    out = (wa[..., None] * a.out + wb[..., None] * b.out) / jnp.where(total > 0, total, 1.0)[
        ..., None
    ]
    return Partial(out, top + jnp.log(total))


def logical(cache: jax.Array) -> jax.Array:
    """The cache as the dtype it holds: the engine stores bf16 as uint16 bit patterns."""
    if cache.dtype == jnp.uint16:
        return jax.lax.bitcast_convert_type(cache, jnp.bfloat16)
    return cache


def gather_context(
    cache: jax.Array, layer: int, n_blocks: int, block_tables: jax.Array
) -> jax.Array:
    """Each row's context (B, Hkv, P, hd) from the layer's blocks, as the engine gathers it."""
    b, nb = block_tables.shape
    g = logical(jnp.take(cache, block_tables + layer * n_blocks, axis=0, mode="clip"))
    hkv, bs, hd = cache.shape[1:]
    return jnp.swapaxes(g, 1, 2).reshape(b, hkv, nb * bs, hd)


def xla_context(
    qs: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    layer: int,
    n_blocks: int,
    block_tables: jax.Array,
    lengths: jax.Array,
) -> Partial:
    """Reference: scaled ``qs`` (B, Hkv, G, hd) over the gathered context, masked by length;
    matmuls in the cache dtype with fp32 accumulation, as ``model._attention``."""
    k = gather_context(k_cache, layer, n_blocks, block_tables)
    v = gather_context(v_cache, layer, n_blocks, block_tables)
    s = jax.lax.dot_general(
        qs.astype(k.dtype), k, (((3,), (3,)), ((0, 1), (0, 1))), preferred_element_type=F32
    )
    valid = (jnp.arange(k.shape[2])[None, :] < lengths[:, None])[:, None, None]
    s = jnp.where(valid, s, -jnp.inf)
    top = s.max(-1)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    e = jnp.exp(s - top[..., None])
    total = e.sum(-1)
    o = jax.lax.dot_general(
        e.astype(v.dtype), v, (((3,), (2,)), ((0, 1), (0, 1))), preferred_element_type=F32
    )
    return Partial(o / jnp.where(total > 0, total, 1.0)[..., None], top + jnp.log(total))


def fold_heads(
    cache: jax.Array, layer: int, n_blocks: int, block_tables: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The cache as kernel pages without a copy: ``(1, L * n_blocks * Hkv, bs, hd)`` (one KV
    head), and a page table ``(B * Hkv, pps)`` whose row ``b * Hkv + h`` lists row ``b``'s
    blocks of head ``h`` in ``layer``."""
    total, hkv, bs, hd = cache.shape
    pages = logical(cache).reshape(1, total * hkv, bs, hd)
    blocks = (block_tables + layer * n_blocks).astype(jnp.int32)
    table = blocks[:, None, :] * hkv + jnp.arange(hkv, dtype=jnp.int32)[None, :, None]
    return pages, table.reshape(-1, block_tables.shape[1])


def pallas_context(
    qs: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    layer: int,
    n_blocks: int,
    block_tables: jax.Array,
    lengths: jax.Array,
    *,
    kernel: str,
    interpret: bool,
) -> Partial:
    """The context part on a Pallas kernel (``pallas_tpu`` or ``pallas_gpu``), through
    ``fold_heads``; same contract as ``xla_context``."""
    b, hkv, g, hd = qs.shape
    k_pages, table = fold_heads(k_cache, layer, n_blocks, block_tables)
    v_pages, _ = fold_heads(v_cache, layer, n_blocks, block_tables)
    call = tpu_paged_attention if kernel == "pallas_tpu" else gpu_paged_attention
    out, lse = call(
        qs.reshape(b * hkv, g, hd).astype(k_pages.dtype),
        k_pages,
        v_pages,
        jnp.repeat(lengths.astype(jnp.int32), hkv),
        table,
        interpret=interpret,
    )
    return Partial(out.reshape(b, hkv, g, hd), lse.reshape(b, hkv, g))


def new_token(qs: jax.Array, k_new: jax.Array, v_new: jax.Array) -> Partial:
    """The row's own token as a one-key ``Partial``: ``k_new``/``v_new`` (B, Hkv, 1, hd)."""
    k, v = k_new[:, :, 0], v_new[:, :, 0]
    s = jnp.einsum("bhgd,bhd->bhg", qs.astype(k.dtype), k, preferred_element_type=F32)
    return Partial(jnp.broadcast_to(v.astype(F32)[:, :, None], qs.shape), s)


def empty(qs: jax.Array) -> Partial:
    """No keys at all (a context of zero blocks)."""
    return Partial(jnp.zeros(qs.shape, F32), jnp.full(qs.shape[:-1], -jnp.inf, F32))


@functools.partial(jax.jit, static_argnames=("layer", "n_blocks", "kernel", "interpret"))
def decode_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    layer: int,
    block_tables: jax.Array,
    lengths: jax.Array,
    *,
    n_blocks: int,
    kernel: Kernel = "auto",
    k_new: jax.Array | None = None,
    v_new: jax.Array | None = None,
    interpret: bool = False,
) -> jax.Array:
    """Decode attention of ``q`` (B, 1, Hkv, G, hd), RoPE applied, unscaled, over each row's
    cached context in ``layer`` (``block_tables`` (B, pps) block ids within the layer, block 0
    = scratch; ``lengths`` (B,) valid tokens) and, if given, the row's new ``k_new``/``v_new``
    (B, Hkv, 1, hd) in the cache's logical dtype. Caches: (n_layers * n_blocks, Hkv, bs, hd),
    bf16 possibly stored as uint16. Returns (B, 1, Hkv * G * hd) fp32, as ``model._attention``.

    ``interpret`` runs a Pallas kernel on the CPU (TPU interpret mode / Pallas interpreter)."""
    b, _, hkv, g, hd = q.shape
    dtype = logical(k_cache).dtype
    # Scaled in fp32, then rounded to the cache dtype once, as model._attention does.
    qs = (q[:, 0].astype(F32) * (1.0 / np.sqrt(hd))).astype(dtype)
    args: tuple[Any, ...] = (qs, k_cache, v_cache, layer, n_blocks, block_tables, lengths)
    name = resolve_kernel(kernel)
    if block_tables.shape[1] == 0:
        part = empty(qs)
    elif name == "xla":
        part = xla_context(*args)
    else:
        part = pallas_context(*args, kernel=name, interpret=interpret)
    if k_new is not None and v_new is not None:
        part = merge(part, new_token(qs, k_new, v_new))
    return part.out.reshape(b, 1, hkv * g * hd)
