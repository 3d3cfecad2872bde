"""The Llama forward pass in JAX over a paged KV cache: one jit-compiled step for prefill and
decode alike.

``step`` runs ``B`` sequences of ``T`` new tokens each (decode: ``T = 1``; prefill: ``B`` prompt
chunks of up to ``T`` tokens) against each sequence's cached context, read from the paged
cache through its block table. Shapes are bucketed by the caller (``runner.py``).

Layout choices, each measured on XLA:CPU (see docs/local_tier_jax.md):

- Q and K are un-permuted at load (llama.cpp's converter interleaves them for its RoPE), so the
  model uses split-half RoPE; the reference forward (``reference.py``) instead keeps the file's
  order with interleaved RoPE, which cross-checks the un-permutation.
- The embedding is stored once, transposed ``(d_model, vocab)``: the logits are ``h @ E^T``
  without XLA copying a transpose every step, and the lookup gathers columns. A model with
  its own output matrix (untied) keeps the input embedding as rows ``(vocab, d_model)``.
- Optional parts (Q/K/V and output-projection biases) are ``None`` when the model has none,
  so the compiled step of a model without them has no bias adds at all. RoPE frequencies
  (with any scaling) are computed once at load (``rope.py``).
- QKV and gate/up are fused into one matrix each (fewer, larger matmuls).
- Weights may be bf16; activations and accumulation stay fp32 (``preferred_element_type``).
  With int8 (``quant.py``) the four matrices of each layer are ``QuantMatrix`` (int8 + one fp32
  scale per output column); the embedding stays bf16. Which matmul a weight takes is decided
  while tracing, so the fp32 and bf16 steps are unchanged.
- The cache is one array per K and V, ``(n_layers * n_blocks, kv_heads, block_size,
  head_dim)`` (paged, head-major inside a block). Attention (``attention.py``) reads the old
  context, chunk by chunk as far as the rows fill it, plus the step's new K/V, and only after
  all layers are done are the new K/V written back with one scatter. Reading before writing
  lets XLA update the donated cache in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from local_tier.jax.attention import ContextRef, attention, logical_dtype, to_cache
from local_tier.jax.device_sampling import SamplingArrays, advance, sample
from local_tier.jax.gguf_loader import HParams, ModelTensors
from local_tier.jax.quant import QuantMatrix, qdot, quantize
from local_tier.jax.rope import inv_frequencies

F32 = jnp.float32
Arr = Any  # a jax.Array on the device, or the numpy array it is built from on the host


class LayerWeights(NamedTuple):
    """One transformer block's weights (matrices in ``(in, out)`` order)."""

    attn_norm: Arr  # (d_model,) fp32
    ffn_norm: Arr  # (d_model,) fp32
    w_qkv: Arr  # (d_model, (H + 2 * Hkv) * hd)
    w_o: Arr  # (H * hd, d_model)
    w_gu: Arr  # (d_model, 2 * d_ff)
    w_down: Arr  # (d_ff, d_model)
    b_qkv: Arr | None = None  # ((H + 2 * Hkv) * hd,) fp32, Qwen2 and attention_bias models
    b_o: Arr | None = None  # (d_model,) fp32, attention_bias models


class Weights(NamedTuple):
    """Device weights in the engine's layout.

    Layers are separate arrays, not one stacked array: slicing layer ``i`` out of a stacked
    parameter made XLA:CPU copy the slice before every matmul (10x slower decode).
    """

    emb_t: Arr  # (d_model, vocab): the output projection, and the lookup when tied
    out_norm: Arr  # (d_model,) fp32
    layers: tuple[LayerWeights, ...]
    rope_inv: Arr  # (head_dim // 2,) fp32 inverse frequencies
    emb_in: Arr | None = None  # (vocab, d_model) input embedding of an untied model


class StepInputs(NamedTuple):
    """One step's int32 inputs; padding rows/tokens point at the scratch block 0."""

    tokens: Arr  # (B, T) token ids
    positions: Arr  # (B, T) absolute positions
    n_new: Arr  # (B,) valid new tokens per row (0 for a padding row)
    ctx_blocks: Arr  # (B, P // block_size) block table of the context
    ctx_len: Arr  # (B,) valid context tokens per row
    write_blocks: Arr  # (B, T) block of each new token's K/V
    write_offsets: Arr  # (B, T) position inside that block


@dataclass(frozen=True)
class ModelSpec:
    """Static facts the compiled step closes over."""

    hp: HParams
    n_blocks: int  # cache blocks per layer, scratch block 0 included
    block_size: int
    tp: int = 1  # tensor-parallel shards the fused matrices are packed for (sharding.py)
    # Decode attention: "xla" (``_attention`` over the gathered context) or a Pallas kernel
    # reading the paged cache in place, "pallas_tpu" / "pallas_gpu" (attention_kernels.py);
    # ``interpret`` runs the kernel on the CPU (tests only).
    attention: str = "xla"
    interpret: bool = False


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head row interleave of Q/K rows (out, ...) or a bias (out,):
    interleaved -> split-half."""
    hd = w.shape[0] // n_heads
    return w.reshape(n_heads, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def shard_major(parts: list[np.ndarray], tp: int) -> np.ndarray:
    """Concatenate ``parts`` along axis 0 so that each of ``tp`` equal shards is contiguous:
    shard ``s`` is ``[s-th chunk of parts[0] | s-th chunk of parts[1] | ...]``. With ``tp = 1``
    this is the plain concatenation (today's layout). Each part's length must divide by tp."""
    if tp == 1:
        return np.concatenate(parts, axis=0)
    chunks = [np.split(p, tp, axis=0) for p in parts]
    return np.concatenate([c[s] for s in range(tp) for c in chunks], axis=0)


def _qkv_bias(t: dict[str, np.ndarray], i: int, hp: HParams, tp: int = 1) -> np.ndarray | None:
    """The fused Q/K/V bias (Q/K un-permuted, shard-major for ``tp``), zeros for a part
    without one; None if none."""
    names = ("attn_q", "attn_k", "attn_v")
    if not any(f"blk.{i}.{n}.bias" in t for n in names):
        return None
    sizes = (hp.n_heads, hp.n_kv_heads, hp.n_kv_heads)
    parts = [
        t.get(f"blk.{i}.{n}.bias", np.zeros(h * hp.head_dim, np.float32)).astype(np.float32)
        for n, h in zip(names, sizes, strict=True)
    ]
    parts[0], parts[1] = unpermute_qk(parts[0], hp.n_heads), unpermute_qk(parts[1], hp.n_kv_heads)
    return shard_major(parts, tp)


def pack_weights(model: ModelTensors, dtype: Any, tp: int = 1) -> Weights:
    """Arrange the model's tensors into ``Weights`` (numpy, on the host). ``dtype`` int8:
    the layer matrices are quantized (``quant.quantize``), the embedding is kept in bf16.
    ``tp`` > 1 packs the fused QKV and gate/up columns shard-major (``shard_major``) for
    ``tp`` tensor-parallel devices (``sharding.py``); 1 is the plain ``[Q|K|V]``, ``[G|U]``."""
    hp, t = model.hparams, model.tensors
    int8 = np.dtype(dtype) == np.int8
    emb_dtype = jnp.bfloat16 if int8 else dtype

    def matrix(w: np.ndarray) -> Any:
        w = np.ascontiguousarray(w)
        return quantize(w) if int8 else w.astype(dtype)

    def layer(i: int, name: str) -> np.ndarray:
        return t[f"blk.{i}.{name}.weight"]

    def block(i: int) -> LayerWeights:
        q = unpermute_qk(layer(i, "attn_q"), hp.n_heads)
        k = unpermute_qk(layer(i, "attn_k"), hp.n_kv_heads)
        qkv = shard_major([q, k, layer(i, "attn_v")], tp).T
        gu = shard_major([layer(i, "ffn_gate"), layer(i, "ffn_up")], tp).T
        b_o = t.get(f"blk.{i}.attn_output.bias")
        return LayerWeights(
            attn_norm=layer(i, "attn_norm").astype(np.float32),
            ffn_norm=layer(i, "ffn_norm").astype(np.float32),
            w_qkv=matrix(qkv),
            w_o=matrix(layer(i, "attn_output").T),
            w_gu=matrix(gu),
            w_down=matrix(layer(i, "ffn_down").T),
            b_qkv=_qkv_bias(t, i, hp, tp),
            b_o=None if b_o is None else b_o.astype(np.float32),
        )

    emb, out = t["token_embd.weight"], t.get("output.weight")  # tied unless it has its own
    return Weights(
        emb_t=np.ascontiguousarray((emb if out is None else out).T).astype(emb_dtype),
        out_norm=t["output_norm.weight"].astype(np.float32),
        layers=tuple(block(i) for i in range(hp.n_layers)),
        rope_inv=inv_frequencies(hp, t.get("rope_freqs.weight")),
        emb_in=None if out is None else np.ascontiguousarray(emb).astype(emb_dtype),
    )


def _dot(x: jax.Array, w: jax.Array | QuantMatrix) -> jax.Array:
    if isinstance(w, QuantMatrix):
        return qdot(x, w)
    return jnp.dot(x.astype(w.dtype), w, preferred_element_type=F32)


def _rms(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x: jax.Array, pos: jax.Array, inv: jax.Array) -> jax.Array:
    """Split-half RoPE on (B, T, heads, hd) at positions (B, T), frequencies ``inv``."""
    half = x.shape[-1] // 2
    ang = pos.astype(F32)[..., None, None] * inv  # (B, T, 1, half)
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _split_columns(y: jax.Array, sizes: tuple[int, ...], tp: int) -> list[jax.Array]:
    """Undo ``shard_major`` on the last axis: the parts (of ``sizes`` columns each, in the
    model's order) of a fused matmul's output packed for ``tp`` shards. Per shard the parts
    are contiguous, so with the columns split over ``tp`` devices each device slices only its
    own columns and the merged parts stay split (heads / MLP columns) without communication."""
    lead = y.shape[:-1]
    if tp == 1:
        ends = [int(e) for e in np.cumsum(sizes)]
        return [y[..., e - n : e] for n, e in zip(sizes, ends, strict=True)]
    per = y.reshape(*lead, tp, -1)
    ends = [int(e) for e in np.cumsum([n // tp for n in sizes])]
    return [per[..., e - n // tp : e].reshape(*lead, n) for n, e in zip(sizes, ends, strict=True)]


def _layer(
    spec: ModelSpec,
    w: LayerWeights,
    rope_inv: jax.Array,
    i: int,
    x: jax.Array,
    inp: StepInputs,
    k_cache: jax.Array,
    v_cache: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    hp = spec.hp
    b, t, _ = x.shape
    nh, nkv, hd = hp.n_heads, hp.n_kv_heads, hp.head_dim
    h = _rms(x, w.attn_norm, hp.rms_eps)
    qkv = _dot(h, w.w_qkv)
    if w.b_qkv is not None:
        qkv = qkv + w.b_qkv
    q, k, v = _split_columns(qkv, (nh * hd, nkv * hd, nkv * hd), spec.tp)
    q, k, v = q.reshape(b, t, nh, hd), k.reshape(b, t, nkv, hd), v.reshape(b, t, nkv, hd)
    q = _rope(q, inp.positions, rope_inv).reshape(b, t, nkv, nh // nkv, hd)
    k = _rope(k, inp.positions, rope_inv)
    # New K/V rounded to the cache dtype before use, so a token attends to identical keys
    # whether they come from this step or, later, from the cache.
    k_c, v_c = k.astype(logical_dtype(k_cache)), v.astype(logical_dtype(v_cache))
    if t == 1 and spec.attention != "xla":  # the kernel reads the context in place
        # Imported here: Pallas (Triton, Mosaic) loads only where a kernel is wanted.
        from local_tier.jax.attention_kernels import decode_attention

        o = decode_attention(
            q,
            k_cache,
            v_cache,
            i,
            inp.ctx_blocks,
            inp.ctx_len,
            n_blocks=spec.n_blocks,
            kernel=spec.attention,
            k_new=k_c.swapaxes(1, 2),
            v_new=v_c.swapaxes(1, 2),
            interpret=spec.interpret,
        )
    else:
        ctx = ContextRef(k_cache, v_cache, i * spec.n_blocks, inp.ctx_blocks, inp.ctx_len)
        o = attention(q, k_c.swapaxes(1, 2), v_c.swapaxes(1, 2), inp.n_new, ctx)
    attn = _dot(o, w.w_o)
    x = x + (attn if w.b_o is None else attn + w.b_o)
    h = _rms(x, w.ffn_norm, hp.rms_eps)
    gate, up = _split_columns(_dot(h, w.w_gu), (hp.d_ff, hp.d_ff), spec.tp)
    x = x + _dot(jax.nn.silu(gate) * up, w.w_down)
    return x, k_c, v_c


def forward(
    spec: ModelSpec,
    w: Weights,
    k_cache: jax.Array,
    v_cache: jax.Array,
    inp: StepInputs,
    logit_index: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Run one step. Returns logits (B, vocab) fp32 of token ``logit_index[b]`` of each row,
    and the caches with the step's K/V written at ``write_blocks``/``write_offsets``."""
    hp = spec.hp
    b, t = inp.tokens.shape
    ids = inp.tokens.reshape(-1)
    if w.emb_in is None:
        x = jnp.take(w.emb_t, ids, axis=1).T.astype(F32).reshape(b, t, -1)
    else:
        x = jnp.take(w.emb_in, ids, axis=0).astype(F32).reshape(b, t, -1)
    new_k, new_v = [], []
    for i in range(hp.n_layers):
        x, k, v = _layer(spec, w.layers[i], w.rope_inv, i, x, inp, k_cache, v_cache)
        new_k.append(k)
        new_v.append(v)
    last = jnp.take_along_axis(x, logit_index[:, None, None], axis=1)[:, 0]
    if b == 1:  # a one-row bf16 matmul takes XLA:CPU's slow path (30 ms for the logits)
        last = jnp.concatenate([last, last])
    logits = _dot(_rms(last, w.out_norm, hp.rms_eps), w.emb_t)[:b]
    # All layers' new K/V in one scatter per cache, after every read of the old cache.
    offs = (jnp.arange(hp.n_layers, dtype=jnp.int32) * spec.n_blocks)[:, None, None]
    blk = (inp.write_blocks[None] + offs).reshape(-1)
    pos = jnp.broadcast_to(inp.write_offsets[None], (hp.n_layers, b, t)).reshape(-1)
    shape = (-1, hp.n_kv_heads, hp.head_dim)
    k_cache = k_cache.at[blk, :, pos, :].set(to_cache(jnp.stack(new_k), k_cache).reshape(shape))
    v_cache = v_cache.at[blk, :, pos, :].set(to_cache(jnp.stack(new_v), v_cache).reshape(shape))
    return logits, k_cache, v_cache


def make_step(spec: ModelSpec) -> Any:
    """The jitted step ``(w, k_cache, v_cache, inp, logit_index) -> (logits, argmax, k, v)``;
    the caches are donated (updated in place)."""

    def step(
        w: Weights, k_cache: jax.Array, v_cache: jax.Array, inp: StepInputs, li: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        logits, k_cache, v_cache = forward(spec, w, k_cache, v_cache, inp, li)
        return logits, jnp.argmax(logits, axis=-1).astype(jnp.int32), k_cache, v_cache

    return jax.jit(step, donate_argnums=(1, 2))


def make_sampling_step(spec: ModelSpec, branches: bool = True) -> Any:
    """The jitted serving step: ``(w, k_cache, v_cache, inp, logit_index, sa, kept) ->
    (logits, tokens, k, v, sa')``. Each row's token is drawn on the device
    (``device_sampling.sample`` with the row's parameters in ``sa``), and ``sa'`` is ``sa``
    advanced past it for the rows in ``kept`` (B,) bool (generated count + 1, token marked
    seen), so a following decode step of the same rows needs nothing from the host. The
    caches are donated. ``branches``: see ``device_sampling.sample`` (False on GPUs)."""

    def step(
        w: Weights,
        k_cache: jax.Array,
        v_cache: jax.Array,
        inp: StepInputs,
        li: jax.Array,
        sa: SamplingArrays,
        kept: jax.Array,
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, SamplingArrays]:
        logits, k_cache, v_cache = forward(spec, w, k_cache, v_cache, inp, li)
        tokens = sample(logits, sa, branches=branches)
        return logits, tokens, k_cache, v_cache, advance(sa, tokens, kept)

    return jax.jit(step, donate_argnums=(1, 2))


def new_cache(spec: ModelSpec, dtype: Any, device: Any = None) -> tuple[jax.Array, jax.Array]:
    """Zeroed K and V caches, (n_layers * n_blocks, kv_heads, block_size, head_dim) each;
    block 0 of every layer is scratch for padding. ``device``: a device or a sharding (with
    tensor parallelism, ``sharding.Placement.cache``: split by kv head)."""
    hp = spec.hp
    shape = (hp.n_layers * spec.n_blocks, hp.n_kv_heads, spec.block_size, hp.head_dim)
    if jnp.dtype(dtype) == jnp.bfloat16:
        dtype = jnp.uint16  # see _logical
    k = jnp.zeros(shape, dtype, device=device)
    v = jnp.zeros(shape, dtype, device=device)
    return k, v
