"""The engine's chunked paged attention (``attention.py``) against a dense NumPy softmax.

The context is read CHUNK_BLOCKS blocks per loop iteration with an online softmax; these
cases run it with chunks of 1, 2 and 16 blocks (several iterations, a last chunk past the
table's end, one chunk for all), over rows with no context, a context ending mid-block, one
filling the table, and padding rows, for decode (T = 1) and prefill (T > 1, causal, rows
with fewer new tokens than T)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from local_tier.jax import attention as A

L, NB, HKV, BS, HD, G = 2, 12, 2, 4, 8, 3
LAYER = 1
WIDTH = 5  # table columns: 20 context tokens at most


def dense_reference(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    k_new: np.ndarray,
    v_new: np.ndarray,
    n_new: np.ndarray,
    tables: np.ndarray,
    lengths: np.ndarray,
) -> np.ndarray:
    """Row by row: gather the context token by token, append the visible new keys, softmax."""
    b, t = q.shape[:2]
    out = np.zeros((b, t, HKV * G * HD), np.float64)
    for r in range(b):
        idx = [LAYER * NB + tables[r, p // BS] for p in range(lengths[r])]
        offs = [p % BS for p in range(lengths[r])]
        for i in range(t):
            for h in range(HKV):
                keys = [k_cache[blk, h, o] for blk, o in zip(idx, offs, strict=True)]
                vals = [v_cache[blk, h, o] for blk, o in zip(idx, offs, strict=True)]
                if i >= n_new[r]:
                    continue  # a padding query: not compared
                keys += [k_new[r, h, j] for j in range(i + 1)]
                vals += [v_new[r, h, j] for j in range(i + 1)]
                kk, vv = np.array(keys, np.float64), np.array(vals, np.float64)
                for gi in range(G):
                    s = kk @ q[r, i, h, gi].astype(np.float64) / np.sqrt(HD)
                    p = np.exp(s - s.max())
                    col = (h * G + gi) * HD
                    out[r, i, col : col + HD] = (p / p.sum()) @ vv
    return out


def run_case(seed: int, t: int, lengths: list[int], n_new: list[int], chunk: int) -> None:
    rng = np.random.default_rng(seed)
    b = len(lengths)
    k_cache = rng.standard_normal((L * NB, HKV, BS, HD)).astype(np.float32)
    v_cache = rng.standard_normal((L * NB, HKV, BS, HD)).astype(np.float32)
    q = rng.standard_normal((b, t, HKV, G, HD)).astype(np.float32) * 2
    k_new = rng.standard_normal((b, HKV, t, HD)).astype(np.float32)
    v_new = rng.standard_normal((b, HKV, t, HD)).astype(np.float32)
    tables = rng.integers(1, NB, size=(b, WIDTH)).astype(np.int32)
    lens, news = np.array(lengths, np.int32), np.array(n_new, np.int32)
    ref = A.ContextRef(
        jnp.asarray(k_cache), jnp.asarray(v_cache), LAYER * NB, jnp.asarray(tables), lens
    )
    A_chunk = A.CHUNK_BLOCKS
    A.CHUNK_BLOCKS = chunk  # read while tracing
    try:
        got = jax.jit(A.attention)(q, k_new, v_new, jnp.asarray(news), ref)
    finally:
        A.CHUNK_BLOCKS = A_chunk
    want = dense_reference(q, k_cache, v_cache, k_new, v_new, news, tables, lens)
    for r in range(b):
        for i in range(t):
            if i < news[r]:  # the other queries are padding
                np.testing.assert_allclose(np.asarray(got)[r, i], want[r, i], atol=2e-5)


@pytest.mark.parametrize("chunk", [1, 2, 16])
def test_decode_rows_of_every_context_length_kind(chunk: int) -> None:
    # no context; mid-block; exactly full blocks; the whole table; a padding row (n_new 0)
    run_case(0, 1, [0, 7, 8, WIDTH * BS, 13], [1, 1, 1, 1, 0], chunk)


def test_padding_rows_stay_finite() -> None:
    """A padding row (no new token, no context) sees no key at all: its output is unused
    but must not be NaN, which would poison nothing here yet trips debug checks."""
    ref = A.ContextRef(
        jnp.ones((L * NB, HKV, BS, HD)),
        jnp.ones((L * NB, HKV, BS, HD)),
        0,
        jnp.zeros((2, 2), jnp.int32),
        jnp.array([5, 0], jnp.int32),
    )
    q, new = jnp.ones((2, 1, HKV, G, HD)), jnp.ones((2, HKV, 1, HD))
    out = A.attention(q, new, new, jnp.array([1, 0], jnp.int32), ref)
    assert np.isfinite(np.asarray(out)).all()


@pytest.mark.parametrize("chunk", [1, 2, 16])
def test_prefill_is_causal_over_context_and_new_tokens(chunk: int) -> None:
    run_case(1, 5, [0, 9, WIDTH * BS], [5, 3, 1], chunk)


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    rows=st.lists(st.tuples(st.integers(0, WIDTH * BS), st.integers(0, 3)), min_size=1, max_size=4),
    chunk=st.sampled_from([1, 2, 3, 16]),
)
def test_matches_dense_softmax_for_any_lengths(
    seed: int, rows: list[tuple[int, int]], chunk: int
) -> None:
    run_case(seed, 3, [n for n, _ in rows], [m for _, m in rows], chunk)


def test_the_loop_runs_only_as_far_as_the_longest_context() -> None:
    """The loop's trip count comes from the rows' lengths, so a short context reads one
    chunk of a long table: the jaxpr holds a while loop, not one gather per chunk."""
    ref = A.ContextRef(
        jnp.zeros((L * NB, HKV, BS, HD)),
        jnp.zeros((L * NB, HKV, BS, HD)),
        0,
        jnp.zeros((1, 64), jnp.int32),
        jnp.array([3], jnp.int32),
    )
    q = jnp.zeros((1, 1, HKV, G, HD))
    new = jnp.zeros((1, HKV, 1, HD))
    jaxpr = jax.make_jaxpr(A.attention)(q, new, new, jnp.ones(1, jnp.int32), ref)
    text = str(jaxpr)
    assert "while" in text and text.count("gather") <= 4
