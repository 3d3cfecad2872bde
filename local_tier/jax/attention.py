"""Attention of one step over the paged KV cache, on XLA (every backend; the Pallas kernels
of ``attention_kernels.py`` replace it for decode on TPU/GPU).

The context is read in chunks of ``CHUNK_BLOCKS`` cache blocks, as many chunks as the longest
row's context needs (a ``while`` loop whose trip count is computed on the device), with an
online softmax across chunks (FlashAttention's running max and sum). So a step's cost follows
the context its rows really have, not the width of the block table: the compiled step does
not depend on the context length at all, one executable per (rows, new tokens) serves every
context, and nothing is compiled per context bucket. Each chunk is gathered block by block
straight into the (B, Hkv, keys, hd) layout the attention matmuls want; a row's whole
context is never gathered at once (the path before this one gathered every layer's padded
context in one piece: figures in docs/local_tier_jax.md, "Compile plan").
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

F32 = jnp.float32
NEG = float(np.finfo(np.float32).min)  # masked score: exp() underflows to 0, no inf - inf
# Blocks read per loop iteration: 16 x 16 tokens. Fewer blocks cost more iterations (XLA:CPU
# pays a fixed cost per iteration and per gather); more waste reads past a short context.
CHUNK_BLOCKS = 16


class ContextRef(NamedTuple):
    """Where one layer's context lives: the caches ``(L * n_blocks, Hkv, bs, hd)``, this
    layer's first block, each row's block table ``(B, nb)`` and context length ``(B,)``."""

    k_cache: jax.Array
    v_cache: jax.Array
    layer_offset: int
    blocks: jax.Array
    ctx_len: jax.Array


def logical_dtype(cache: jax.Array) -> Any:
    """The dtype a cache holds: bf16 caches are stored as uint16 bit patterns, because
    XLA:CPU widens a bf16 scatter to f32 and so copied the whole cache twice per step."""
    return jnp.bfloat16 if cache.dtype == jnp.uint16 else cache.dtype


def to_cache(x: jax.Array, cache: jax.Array) -> jax.Array:
    """``x`` (already in ``logical_dtype(cache)``) in the cache's stored form."""
    return jax.lax.bitcast_convert_type(x, jnp.uint16) if cache.dtype == jnp.uint16 else x


def gather_blocks(cache: jax.Array, blocks: jax.Array) -> jax.Array:
    """Rows' blocks ``(B, n)`` (absolute cache indices) as ``(B, Hkv, n * bs, hd)``.

    Whole blocks are gathered (take with mode="clip" skips the bounds fix-up of indexing):
    XLA:CPU gathers big slices several times faster than single tokens."""
    b, n = blocks.shape
    g = jnp.take(cache, blocks, axis=0, mode="clip")
    if cache.dtype == jnp.uint16:
        g = jax.lax.bitcast_convert_type(g, jnp.bfloat16)
    hkv, bs, hd = cache.shape[1:]
    return jnp.swapaxes(g, 1, 2).reshape(b, hkv, n * bs, hd)


def _scores(qh: jax.Array, k: jax.Array) -> jax.Array:
    """(B, Hkv, G*T, hd) x (B, Hkv, keys, hd) -> (B, Hkv, G*T, keys), fp32."""
    dims = (((3,), (3,)), ((0, 1), (0, 1)))
    return jax.lax.dot_general(qh.astype(k.dtype), k, dims, preferred_element_type=F32)


def _mix(e: jax.Array, v: jax.Array) -> jax.Array:
    """(B, Hkv, G*T, keys) x (B, Hkv, keys, hd) -> (B, Hkv, G*T, hd), fp32."""
    dims = (((3,), (2,)), ((0, 1), (0, 1)))
    return jax.lax.dot_general(e.astype(v.dtype), v, dims, preferred_element_type=F32)


def _new_token_mask(n_new: jax.Array, t: int, g: int) -> jax.Array:
    """(B, 1, G*T, T): query row g*T + i may see new key j iff j <= i < n_new."""
    idx = jnp.arange(t)
    ok = (idx[None, :] <= idx[:, None])[None] & (idx < n_new[:, None])[:, None]
    return jnp.tile(ok, (1, g, 1))[:, None]


Partial = tuple[jax.Array, jax.Array, jax.Array]  # running max, sum of exp, weighted values


def _merge(acc: Partial, s: jax.Array, v: jax.Array) -> Partial:
    """``acc`` extended by keys with scores ``s`` (masked ones at NEG) and values ``v``."""
    m, denom, o = acc
    m2 = jnp.maximum(m, s.max(-1, keepdims=True))
    scale = jnp.exp(m - m2)
    e = jnp.exp(s - m2)
    return m2, denom * scale + e.sum(-1, keepdims=True), o * scale + _mix(e, v)


def _context_chunks(qh: jax.Array, ctx: ContextRef, acc: Partial) -> Partial:
    """``acc`` extended by every row's context, CHUNK_BLOCKS blocks per loop iteration, for
    as many iterations as the longest context needs (0 when no row has context)."""
    nb = ctx.blocks.shape[1]
    bs = ctx.k_cache.shape[2]
    per = min(CHUNK_BLOCKS, nb)
    width = -(-nb // per) * per  # pad the table so every chunk's slice is in range
    table = jnp.pad(ctx.blocks, ((0, 0), (0, width - nb))) + ctx.layer_offset
    span = per * bs
    trips = (jnp.max(ctx.ctx_len) + span - 1) // span

    def chunk(c: jax.Array, acc: Partial) -> Partial:
        cols = jax.lax.dynamic_slice_in_dim(table, c * per, per, axis=1)
        pos = c * span + jnp.arange(span)
        ok = (pos[None, :] < ctx.ctx_len[:, None])[:, None, None]
        s = jnp.where(ok, _scores(qh, gather_blocks(ctx.k_cache, cols)), NEG)
        return _merge(acc, s, gather_blocks(ctx.v_cache, cols))

    out: Partial = jax.lax.fori_loop(0, trips, chunk, acc)
    return out


def attention(
    q: jax.Array, k_new: jax.Array, v_new: jax.Array, n_new: jax.Array, ctx: ContextRef
) -> jax.Array:
    """Softmax attention of q (B,T,Hkv,G,hd) over each row's cached context and the step's
    own keys/values (B,Hkv,T,hd), causal among the new tokens. Returns (B, T, Hkv*G*hd) fp32.

    Everything is head-major with (B, Hkv) as batch dimensions of ``dot_general``: XLA:CPU
    runs that as a few batched matmuls, while the same einsum on (B, P, Hkv, hd) operands
    transposed them first (3.5x slower)."""
    b, t, hkv, g, hd = q.shape
    qh = q.transpose(0, 2, 3, 1, 4).reshape(b, hkv, g * t, hd) * (1.0 / np.sqrt(hd))
    s_new = jnp.where(_new_token_mask(n_new, t, g), _scores(qh, k_new), NEG)
    m = s_new.max(-1, keepdims=True)
    e_new = jnp.exp(s_new - m)
    acc = (m, e_new.sum(-1, keepdims=True), _mix(e_new, v_new))
    if ctx.blocks.shape[1] > 0:
        acc = _context_chunks(qh, ctx, acc)
    _, denom, o = acc
    o = (o / denom).reshape(b, hkv, g, t, hd).transpose(0, 3, 1, 2, 4)
    return o.reshape(b, t, hkv * g * hd)
