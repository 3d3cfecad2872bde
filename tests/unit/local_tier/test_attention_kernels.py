"""Decode attention kernels against the engine's own attention, on the CPU.

The Pallas kernels run interpreted: the TPU kernel in TPU interpret mode (simulated DMAs and
semaphores), the GPU kernel in Pallas' generic interpreter. Each case is compared with
``attention.attention`` (the engine's XLA path) over the same paged cache.
Shapes are tiny because interpretation is slow (about a second per compiled case)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental.pallas import tpu as pltpu

from local_tier.jax import attention_kernels as ak
from local_tier.jax import model as M
from local_tier.jax import pallas_paged as pp
from local_tier.jax.attention import ContextRef, attention
from local_tier.jax.hf_loader import load_hf

N_LAYERS, N_BLOCKS, HKV, BS, HD = 2, 8, 2, 8, 16
LAYER = 1  # not 0, so the layer offset into the cache is exercised
# Rows: 4 blocks ending mid-block; 3 blocks sharing the first two with row 0 (a cached prefix)
# and ending mid-block; one block exactly full; no context at all (length 0, its block's
# random contents masked).
TABLES = np.array([[1, 2, 3, 4], [1, 2, 5, 0], [6, 0, 0, 0], [7, 0, 0, 0]], np.int32)
LENGTHS = np.array([29, 19, 8, 0], np.int32)


class Case(NamedTuple):
    q: jax.Array  # (B, 1, Hkv, G, hd) fp32
    k_cache: jax.Array  # (L * n_blocks, Hkv, bs, hd), bf16 stored as uint16 like the engine
    v_cache: jax.Array
    k_new: jax.Array  # (B, Hkv, 1, hd) in the cache's logical dtype
    v_new: jax.Array


def make_case(g: int, dtype: Any, seed: int = 0, bf16_values: bool = False) -> Case:
    """Random inputs; ``bf16_values``: fp32 arrays holding bf16-representable values."""
    rng = np.random.default_rng(seed)
    shape = (N_LAYERS * N_BLOCKS, HKV, BS, HD)
    b = len(LENGTHS)

    def arr(*s: int) -> jax.Array:
        x = jnp.asarray(rng.standard_normal(s).astype(np.float32), dtype)
        return x.astype(jnp.bfloat16).astype(dtype) if bf16_values else x

    k, v = arr(*shape), arr(*shape)
    if dtype == jnp.bfloat16:
        k, v = (jax.lax.bitcast_convert_type(c, jnp.uint16) for c in (k, v))
    q = jnp.asarray(rng.standard_normal((b, 1, HKV, g, HD)).astype(np.float32) * 2.0)
    return Case(q, k, v, arr(b, HKV, 1, HD), arr(b, HKV, 1, HD))


def engine_attention(c: Case) -> jax.Array:
    """``attention.attention`` (the engine's XLA path) over the same cache and tables."""
    b = len(LENGTHS)
    ref = ContextRef(
        c.k_cache, c.v_cache, LAYER * N_BLOCKS, jnp.asarray(TABLES), jnp.asarray(LENGTHS)
    )
    return attention(c.q, c.k_new, c.v_new, jnp.ones(b, jnp.int32), ref)


def run(c: Case, kernel: str, **kw: Any) -> jax.Array:
    args = (c.q, c.k_cache, c.v_cache, LAYER, jnp.asarray(TABLES), jnp.asarray(LENGTHS))
    kw.setdefault("k_new", c.k_new)
    kw.setdefault("v_new", c.v_new)
    out: jax.Array = ak.decode_attention(
        *args, n_blocks=N_BLOCKS, kernel=kernel, interpret=True, **kw
    )
    return out


def close(a: jax.Array, b: jax.Array, atol: float) -> None:
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=0)


# fp32 paths agree to rounding; bf16 ones to bf16 rounding of probabilities and outputs
# (|values| ~ 1). The TPU kernel loads K/V as bf16 even from an fp32 cache (see below).
TOL = {
    ("xla", "float32"): 1e-5,
    ("pallas_gpu", "float32"): 1e-5,
    ("pallas_tpu", "float32"): 2e-2,
}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("g", [1, 3])
@pytest.mark.parametrize("kernel", ["xla", "pallas_tpu", "pallas_gpu"])
def test_kernel_matches_engine_attention(kernel: str, g: int, dtype: Any) -> None:
    c = make_case(g, dtype)
    out = run(c, kernel)
    assert out.shape == (len(LENGTHS), 1, HKV * g * HD) and out.dtype == jnp.float32
    tol = TOL.get((kernel, jnp.dtype(dtype).name), 2e-2)
    close(out, engine_attention(c), tol)
    close(out, run(c, "xla"), tol)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
def test_tpu_kernel_with_eight_queries_per_kv_head(dtype: Any) -> None:
    """G % 8 == 0 takes the kernel's other query layout (no (G, 1, hd) reshape)."""
    c = make_case(8, dtype, seed=1)
    close(run(c, "pallas_tpu"), engine_attention(c), 2e-2)


def test_tpu_kernel_reads_fp32_cache_as_bf16() -> None:
    """The only difference on an fp32 cache is the kernel's bf16 load of K/V: against the
    XLA path on the cache rounded to bf16 (held in fp32) it agrees to fp32 rounding."""
    c = make_case(3, jnp.float32, seed=2)

    def rounded(x: jax.Array) -> jax.Array:
        return x.astype(jnp.bfloat16).astype(jnp.float32)

    r = c._replace(k_cache=rounded(c.k_cache), v_cache=rounded(c.v_cache))
    tpu = run(c, "pallas_tpu", k_new=None, v_new=None)
    close(tpu, run(r, "xla", k_new=None, v_new=None), 2e-5)
    assert float(jnp.abs(tpu - run(c, "xla", k_new=None, v_new=None)).max()) > 1e-4


def test_tpu_kernel_under_forced_interpret_mode() -> None:
    """With interpret=False the kernel follows ``force_tpu_interpret_mode``, as the engine's
    own jitted step would when tested on the CPU."""
    c = make_case(3, jnp.bfloat16, seed=3)
    args = (c.q, c.k_cache, c.v_cache, LAYER, jnp.asarray(TABLES), jnp.asarray(LENGTHS))
    with pltpu.force_tpu_interpret_mode():
        out = ak.decode_attention(
            *args, n_blocks=N_BLOCKS, kernel="pallas_tpu", k_new=c.k_new, v_new=c.v_new
        )
    close(out, engine_attention(c), 2e-2)


@pytest.mark.parametrize("kernel", ["xla", "pallas_tpu", "pallas_gpu"])
def test_write_first_equals_merge(kernel: str) -> None:
    """Writing the new K/V into the cache first and attending to ``length + 1`` cached
    tokens gives what merging the context with the new token gives. (Values are
    bf16-exact so that the TPU kernel's bf16 load of K/V rounds nothing.)"""
    c = make_case(3, jnp.float32, seed=4, bf16_values=True)
    blocks = TABLES[np.arange(len(LENGTHS)), LENGTHS // BS] + LAYER * N_BLOCKS
    offs = LENGTHS % BS
    k = c.k_cache.at[blocks, :, offs].set(c.k_new[:, :, 0])
    v = c.v_cache.at[blocks, :, offs].set(c.v_new[:, :, 0])
    first = ak.decode_attention(
        c.q,
        k,
        v,
        LAYER,
        jnp.asarray(TABLES),
        jnp.asarray(LENGTHS + 1),
        n_blocks=N_BLOCKS,
        kernel=kernel,
        interpret=True,
    )
    close(first, run(c, kernel), 1e-5)


def test_no_context_blocks_attends_to_the_new_token_only() -> None:
    c = make_case(3, jnp.float32, seed=5)
    b = len(LENGTHS)
    empty = jnp.zeros((b, 0), jnp.int32)
    out = ak.decode_attention(
        c.q,
        c.k_cache,
        c.v_cache,
        LAYER,
        empty,
        jnp.zeros(b, jnp.int32),
        n_blocks=N_BLOCKS,
        kernel="pallas_tpu",
        k_new=c.k_new,
        v_new=c.v_new,
    )
    want = jnp.broadcast_to(c.v_new[:, :, :, None], (b, HKV, 1, 3, HD))
    close(out, want.reshape(b, 1, -1), 0)


def context_partials(c: Case) -> tuple[jax.Array, ...]:
    """Scaled folded queries, folded pages, table, lengths, and the XLA context Partial."""
    b, _, hkv, g, hd = c.q.shape
    qs = (c.q[:, 0] / np.sqrt(hd)).astype(ak.logical(c.k_cache).dtype)
    tables, lengths = jnp.asarray(TABLES), jnp.asarray(LENGTHS)
    kp, table = ak.fold_heads(c.k_cache, LAYER, N_BLOCKS, tables)
    vp, _ = ak.fold_heads(c.v_cache, LAYER, N_BLOCKS, tables)
    want = ak.xla_context(qs, c.k_cache, c.v_cache, LAYER, N_BLOCKS, tables, lengths)
    folded = (qs.reshape(b * hkv, g, hd), kp, vp, jnp.repeat(lengths, hkv), table)
    return (*folded, want.out.reshape(b * hkv, g, hd), want.lse.reshape(b * hkv, g))


def check_partial(got: tuple[jax.Array, jax.Array], out: jax.Array, lse: jax.Array) -> None:
    """Same output and log-sum-exp; rows without context have lse -inf (output unused)."""
    has = np.asarray(jnp.repeat(jnp.asarray(LENGTHS), HKV) > 0)
    close(got[0][has], out[has], 1e-5)
    close(got[1][has], lse[has], 1e-4)
    assert np.all(np.isneginf(np.asarray(got[1])[~has]))


@pytest.mark.parametrize("block_tokens", [8, 16, 32])
def test_tpu_kernel_context_and_lse_over_compute_blocks(block_tokens: int) -> None:
    """1, 2 or 4 pages per compute block: the kernel's online softmax across blocks, and
    the statistics it returns, against the XLA context attention (bf16-exact values)."""
    *args, out, lse = context_partials(make_case(3, jnp.float32, seed=6, bf16_values=True))
    got = pp.tpu_paged_attention(*args, interpret=True, block_tokens=block_tokens)
    check_partial(got, out, lse)


@pytest.mark.parametrize("splits,pages", [(1, 4), (2, 1), (2, 2), (4, 1)])
def test_gpu_kernel_context_and_lse_over_splits(splits: int, pages: int) -> None:
    """Partitions of the pages (combined here) and compute blocks within a partition."""
    *args, out, lse = context_partials(make_case(3, jnp.float32, seed=7))
    got = pp.gpu_paged_attention(
        *args, interpret=True, max_splits=splits, max_pages_per_block=pages
    )
    check_partial(got, out, lse)


@given(st.integers(1, 200), st.integers(0, 40), st.booleans())
def test_divisor_at_most_is_the_largest_allowed_divisor(n: int, cap: int, pow2: bool) -> None:
    d = pp.divisor_at_most(n, cap, pow2)
    assert n % d == 0 and 1 <= d <= max(cap, 1)
    assert not pow2 or d & (d - 1) == 0
    bigger = range(d + 1, min(n, max(cap, 1)) + 1)
    assert not any(n % e == 0 and (not pow2 or e & (e - 1) == 0) for e in bigger)


def test_fold_heads_pages_are_the_layers_blocks() -> None:
    c = make_case(1, jnp.bfloat16)
    pages, table = ak.fold_heads(c.k_cache, LAYER, N_BLOCKS, jnp.asarray(TABLES))
    assert pages.shape == (1, N_LAYERS * N_BLOCKS * HKV, BS, HD)
    assert table.shape == (len(LENGTHS) * HKV, TABLES.shape[1])
    cache = ak.logical(c.k_cache)
    for r, row in enumerate(TABLES):
        for h in range(HKV):
            for j, blk in enumerate(row):
                page = pages[0, table[r * HKV + h, j]]
                np.testing.assert_array_equal(page, cache[blk + LAYER * N_BLOCKS, h])


def test_resolve_kernel_by_platform() -> None:
    assert ak.resolve_kernel("auto", "tpu") == "pallas_tpu"
    assert ak.resolve_kernel("auto", "gpu") == "pallas_gpu"
    assert ak.resolve_kernel("auto", "cpu") == "xla"
    assert ak.resolve_kernel("xla", "tpu") == "xla"
    assert ak.resolve_kernel("auto") == "xla"  # this machine is a CPU
    with pytest.raises(ValueError, match="unknown attention kernel"):
        ak.resolve_kernel("flash")


def softmax_partial(s: np.ndarray, v: np.ndarray) -> ak.Partial:
    """Reference Partial over keys ``s`` (n,) with values ``v`` (n, d) in float64."""
    if len(s) == 0:
        return ak.Partial(jnp.zeros(v.shape[1]), jnp.asarray(-np.inf))
    e = np.exp(s - s.max())
    return ak.Partial(jnp.asarray(e @ v / e.sum()), jnp.asarray(s.max() + np.log(e.sum())))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-30, 30), min_size=1, max_size=12),
    st.integers(0, 12),
    st.integers(0, 2**31 - 1),
)
def test_merge_is_softmax_over_the_union(scores: list[float], cut: int, seed: int) -> None:
    """Merging the attention over two disjoint key sets (either possibly empty) equals the
    attention over all keys, in either order."""
    s = np.asarray(scores, np.float64)
    v = np.random.default_rng(seed).standard_normal((len(s), 4))
    cut = min(cut, len(s))
    a, b = softmax_partial(s[:cut], v[:cut]), softmax_partial(s[cut:], v[cut:])
    want = softmax_partial(s, v)
    for m in (ak.merge(a, b), ak.merge(b, a)):
        np.testing.assert_allclose(np.asarray(m.out), np.asarray(want.out), atol=1e-5)
        np.testing.assert_allclose(float(m.lse), float(want.lse), atol=1e-4)


@pytest.mark.parametrize("kernel", ["pallas_tpu", "pallas_gpu"])
def test_the_model_step_decodes_through_a_kernel_like_the_xla_path(
    tmp_path: Path, kernel: str
) -> None:
    """``ModelSpec.attention`` wired into ``model._layer``: a tiny Qwen2-style folder (GQA 2,
    biases) prefills 20 tokens, then one decode step per attention path reads that paged
    context (two blocks of 16, the second partial) in place; logits and the written cache
    must equal the XLA path's (interpret mode on the CPU)."""
    from tests.unit.test_hf_loader import tiny_config, tiny_tensors, write_folder

    cfg = tiny_config()
    model = load_hf(write_folder(tmp_path / "m", cfg, tiny_tensors(cfg, seed=5)))
    n, bs = 20, 16
    specs = {
        name: M.ModelSpec(model.hparams, 4, bs, attention=name, interpret=True)
        for name in ("xla", kernel)
    }
    w = M.pack_weights(model, jnp.float32)
    k, v = M.new_cache(specs["xla"], jnp.float32)
    pos = np.arange(n, dtype=np.int32)
    prefill = M.StepInputs(
        tokens=np.asarray([[1, *range(3, 3 + n - 1)]], np.int32),
        positions=pos[None],
        n_new=np.asarray([n], np.int32),
        ctx_blocks=np.zeros((1, 0), np.int32),
        ctx_len=np.zeros(1, np.int32),
        write_blocks=(1 + pos // bs)[None],
        write_offsets=(pos % bs)[None],
    )
    _, _, k, v = M.make_step(specs["xla"])(w, k, v, prefill, np.asarray([n - 1], np.int32))
    decode = M.StepInputs(
        tokens=np.asarray([[7], [9]], np.int32),
        positions=np.asarray([[n], [n]], np.int32),
        n_new=np.asarray([1, 1], np.int32),
        ctx_blocks=np.asarray([[1, 2], [1, 2]], np.int32),
        ctx_len=np.asarray([n, n], np.int32),
        write_blocks=np.asarray([[2], [3]], np.int32),
        write_offsets=np.asarray([[n % bs], [0]], np.int32),
    )
    args = (w, k, v, decode, np.zeros(2, np.int32))
    traced = {name: str(jax.make_jaxpr(M.make_step(spec))(*args)) for name, spec in specs.items()}
    assert "pallas_call" in traced[kernel] and "pallas_call" not in traced["xla"]
    out = {
        name: M.make_step(spec)(w, jnp.copy(k), jnp.copy(v), decode, np.zeros(2, np.int32))
        for name, spec in specs.items()
    }
    want, got = out["xla"], out[kernel]
    assert np.abs(np.asarray(want[0])).max() > 0.1  # not vacuous
    tol = 2e-2 if kernel == "pallas_tpu" else 1e-5  # the TPU kernel reads K/V as bf16
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), atol=tol, rtol=0)
    # layer 0's new K/V are exact; later layers' follow the attention output's rounding
    np.testing.assert_allclose(np.asarray(got[2]), np.asarray(want[2]), atol=tol, rtol=0)


def test_the_attention_setting_resolves_per_platform() -> None:
    from local_tier.jax.api import EngineConfig
    from local_tier.jax.setup import attention_kernel

    pallas = EngineConfig(attention="pallas")
    assert attention_kernel(EngineConfig(), "tpu", 1) == "xla"  # auto: xla until measured
    assert attention_kernel(pallas, "tpu", 1) == "pallas_tpu"
    assert attention_kernel(pallas, "gpu", 1) == "pallas_gpu"
    with pytest.raises(ValueError, match="needs a TPU or GPU, not cpu"):
        attention_kernel(pallas, "cpu", 1)
    with pytest.raises(ValueError, match="tensor_parallel 1"):
        attention_kernel(pallas, "tpu", 2)
