"""Token sampling on the device (JAX): greedy, temperature, top-k, top-p, per-row seeds, plus
vLLM's ``min_tokens`` and ``repetition_penalty``, as one pure jittable function over a batch.

Per-row parameters travel as arrays (``SamplingArrays``, built on the host by
``build_arrays``), so one compiled function serves every mix of requests. The order is
vLLM's (and ``sampling.py``'s): the end-id ban while below ``min_tokens``, the repetition
penalty, temperature, top-k, top-p, then a draw (greedy rows take the argmax).

Design (see docs/local_tier_jax.md, "Sampling on the device"):

- No full sort. Top-k and top-p become value thresholds: a token is kept when its scaled logit
  is >= the k-th largest value and >= the nucleus threshold (the largest value whose
  "at least this likely" mass reaches ``top_p``). Both come from ``lax.top_k`` over a small
  probe (``probe`` best tokens); a row whose k exceeds the probe, or whose nucleus does not
  end inside it, gets its threshold by a 32-step bisection over the float's bit pattern
  (only when some row needs it, with ``lax.cond``; ``branches=False`` computes every part
  instead, for GPUs, where a conditional waits on the host). Ties at a threshold are all
  kept (vLLM's top-k rule; deterministic).
- The draw is an inverse-CDF with one uniform per row, over the kept tokens' weights, in two
  levels (block sums, then one block), so it costs O(V) with no (B, V) scan.
- Each draw's key is ``fold_in(row key, num_generated)``: the token depends on the row's seed,
  its logits and its position in the output only, never on the batch around it.
- ``advance`` folds a step's tokens into the arrays on the device (count + seen mask), so
  several decode steps can run without the host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from local_tier.jax.api import SamplingParams

F32 = jnp.float32
I32 = jnp.int32
PROBE = 64  # tokens ``lax.top_k`` looks at before a row needs the bisection
BLOCK = 256  # tokens per block of the two-level draw
GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS: a lower temperature is greedy
NO_ID = int(np.iinfo(np.int32).max)  # an out-of-range id: scatters drop it
_KEY_IMPL = "threefry2x32"
# A field of ``SamplingArrays``: np.ndarray as ``build_arrays`` makes it on the host,
# jax.Array once placed on the device (or traced).
Arr = Any

# End ids per row that a step bans while the row is below its min_tokens (EOS ids plus
# stop_token_ids): the engine's one width, so the compiled shapes do not follow requests.
END_WIDTH = 32


class SamplingArrays(NamedTuple):
    """Per-row sampling state of a batch of ``B`` rows over a vocabulary of ``V`` ids.

    Padding rows are greedy with every processor off. ``temperature``, ``top_k`` and
    ``top_p`` of greedy rows are neutral (1, 0, 1), so greedy rows never ask for filtering.
    """

    greedy: Arr  # (B,) bool: argmax (temperature < GREEDY_EPS or top_k == 1)
    temperature: Arr  # (B,) f32
    top_k: Arr  # (B,) i32, 0 = off (also when >= V)
    top_p: Arr  # (B,) f32, 1 = off
    key: Arr  # (B, 2) uint32: threefry2x32 key data of the row
    num_generated: Arr  # (B,) i32: output tokens so far (index of the token to draw)
    min_tokens: Arr  # (B,) i32: end ids are banned while num_generated < min_tokens
    end_ids: Arr  # (B, E) i32: EOS + stop_token_ids, padded with NO_ID
    repetition_penalty: Arr  # (B,) f32, 1 = off
    seen: Arr  # (B, V) bool: ids of the prompt and the output (rows with a penalty)


@dataclass(frozen=True)
class RowState:
    """What the host keeps per running sequence to build its row.

    ``key`` comes from ``row_key`` once per request and stays fixed; ``seen_ids`` (prompt +
    output ids) are read only when the row has a repetition penalty."""

    params: SamplingParams
    key: np.ndarray
    num_generated: int = 0
    end_ids: Sequence[int] = ()
    seen_ids: Sequence[int] = ()


def key_data_for_seed(seed: int) -> np.ndarray:
    """threefry2x32 key data of ``seed`` (taken mod 2**64): equal to
    ``jax.random.key_data(jax.random.key(seed, impl="threefry2x32"))``,
    computed without JAX. (JAX itself keeps only the low 32 bits of a larger seed while x64
    is off, so the two agree for 0 <= seed < 2**32.)"""
    s = seed % 2**64
    return np.array([s >> 32, s & 0xFFFFFFFF], dtype=np.uint32)


def row_key(seed: int | None, rng: np.random.Generator) -> np.ndarray:
    """The key data of a request: from its seed, else drawn from the engine's generator."""
    if seed is not None:
        return key_data_for_seed(seed)
    return rng.integers(0, 2**32, size=2, dtype=np.uint32)


def build_arrays(
    rows: Sequence[RowState | None], batch: int, vocab: int, end_width: int | None = None
) -> SamplingArrays:
    """Host (NumPy) arrays for ``batch`` rows; ``rows[i]`` is None or missing for padding.

    ``end_width`` fixes E (the engine should pass one value so shapes stay stable); by
    default it is the next power of two >= the longest row's end-id set (at least 4)."""
    if len(rows) > batch:
        raise ValueError(f"{len(rows)} rows do not fit a batch of {batch}")
    ends = [_valid_ids(r.end_ids, vocab) if r else [] for r in rows]
    need = max((len(e) for e in ends), default=0)
    width = end_width if end_width is not None else max(4, 1 << max(0, need - 1).bit_length())
    if need > width:
        raise ValueError(f"a row has {need} end ids, more than end_width={width}")
    a = _padding(batch, vocab, width)
    for i, r in enumerate(rows):
        if r is not None:
            _fill_row(a, i, r, ends[i], vocab)
    return SamplingArrays(**a)


def _valid_ids(ids: Sequence[int], vocab: int) -> list[int]:
    return sorted({int(t) for t in ids if 0 <= t < vocab})


def _padding(batch: int, vocab: int, width: int) -> dict[str, np.ndarray]:
    return {
        "greedy": np.ones(batch, bool),
        "temperature": np.ones(batch, np.float32),
        "top_k": np.zeros(batch, np.int32),
        "top_p": np.ones(batch, np.float32),
        "key": np.zeros((batch, 2), np.uint32),
        "num_generated": np.zeros(batch, np.int32),
        "min_tokens": np.zeros(batch, np.int32),
        "end_ids": np.full((batch, width), NO_ID, np.int32),
        "repetition_penalty": np.ones(batch, np.float32),
        "seen": np.zeros((batch, vocab), bool),
    }


def _fill_row(a: dict[str, np.ndarray], i: int, r: RowState, ends: list[int], vocab: int) -> None:
    p = r.params
    greedy = p.temperature < GREEDY_EPS or p.top_k == 1
    a["greedy"][i] = greedy
    if not greedy:
        a["temperature"][i] = p.temperature
        a["top_k"][i] = p.top_k if 0 < p.top_k < vocab else 0
        a["top_p"][i] = p.top_p
    a["key"][i] = r.key
    a["num_generated"][i] = r.num_generated
    a["min_tokens"][i] = p.min_tokens
    a["end_ids"][i, : len(ends)] = ends
    a["repetition_penalty"][i] = p.repetition_penalty
    if p.repetition_penalty != 1.0 and len(r.seen_ids):
        ids = np.asarray(r.seen_ids, dtype=np.int64)
        a["seen"][i, ids[(ids >= 0) & (ids < vocab)]] = True


# --- on the device -------------------------------------------------------------------------


def processed_logits(logits: jax.Array, a: SamplingArrays) -> jax.Array:
    """``logits`` (B, V) as f32 after the ``min_tokens`` ban (end ids -> -inf) and the
    repetition penalty (CTRL: a seen id's positive logit divided, any other multiplied)."""
    x = logits.astype(F32)
    ban = a.num_generated < a.min_tokens
    ids = jnp.where(ban[:, None], a.end_ids, NO_ID)
    rows = jnp.arange(x.shape[0])[:, None]
    x = x.at[rows, ids].set(-jnp.inf, mode="drop")
    # The divisor is a (B, V) select, not a broadcast: XLA rewrites x / broadcast(r) as
    # x * (1 / r), which is off by an ulp from vLLM's (and the host's) true division.
    r = jnp.where(a.seen, a.repetition_penalty[:, None], 1.0)
    return jnp.where(x > 0, x / r, x * r)


def sample(
    logits: jax.Array,
    a: SamplingArrays,
    probe: int = PROBE,
    block: int = BLOCK,
    branches: bool = True,
) -> jax.Array:
    """Next token ids (B,) i32 for ``logits`` (B, V). Pure and jittable (``probe``, ``block``
    and ``branches`` static). A sampled token always has a finite processed logit and lies
    in the top-k and top-p sets; greedy rows get the first index of the largest processed
    logit.

    ``branches``: skip work no row needs with ``lax.cond`` (all-greedy batch, no filter, no
    bisection). Right for CPU and TPU. On GPU a conditional copies its predicate to the host
    and waits for the stream (XLA's ConditionalThunk), which would stall a step dispatched
    ahead; pass False there: every part runs, selected per row, same tokens."""
    x = processed_logits(logits, a)
    greedy_ids = _first_true(x == x.max(-1, keepdims=True), 0)

    def drawn() -> jax.Array:
        s, keep = _scaled_and_kept(x, a, probe, branches)
        w = jnp.where(keep, jnp.exp(s - s.max(-1, keepdims=True)), 0.0)
        ids = _draw(w, _uniforms(a.key, a.num_generated), block)
        return jnp.where(a.greedy, greedy_ids, ids)

    return _unless(jnp.all(a.greedy), lambda: greedy_ids, drawn, branches)


def support(
    logits: jax.Array, a: SamplingArrays, probe: int = PROBE, branches: bool = True
) -> jax.Array:
    """(B, V) bool: the ids a non-greedy row may draw (finite after the processors, within
    top-k and top-p). For tests and diagnostics; ``sample`` uses the same computation."""
    return _scaled_and_kept(processed_logits(logits, a), a, probe, branches)[1]


def advance(a: SamplingArrays, tokens: jax.Array, kept: jax.Array | None = None) -> SamplingArrays:
    """The arrays for the next step after each row drew ``tokens`` (B,): one more token
    generated, and the token marked seen (for the repetition penalty). Rows where ``kept``
    (B,) bool is False are left as they were (a prefill chunk that does not end its prompt,
    padding)."""
    if kept is None:
        kept = jnp.ones(tokens.shape, bool)
    rows = jnp.arange(tokens.shape[0])
    ids = jnp.where(kept, tokens, NO_ID)
    seen = jnp.asarray(a.seen).at[rows, ids].set(True, mode="drop")
    return a._replace(num_generated=a.num_generated + kept.astype(I32), seen=seen)


def put_rows(a: SamplingArrays, rows: jax.Array, new: SamplingArrays) -> SamplingArrays:
    """``a`` with rows ``rows`` (n,) replaced by the n rows of ``new`` (from ``build_arrays``
    with batch n): how the engine admits sequences into a persistent on-device batch without
    rebuilding the rest. Row indices >= B are dropped (pad ``rows`` with B to keep n fixed)."""
    return SamplingArrays(
        *(jnp.asarray(old).at[rows].set(val, mode="drop") for old, val in zip(a, new, strict=True))
    )


def sample_and_advance(
    logits: jax.Array,
    a: SamplingArrays,
    probe: int = PROBE,
    block: int = BLOCK,
    branches: bool = True,
) -> tuple[jax.Array, SamplingArrays]:
    """``sample`` then ``advance``: one decode step's sampling, state kept on the device."""
    tokens = sample(logits, a, probe, block, branches)
    return tokens, advance(a, tokens)


def _unless(
    skip: jax.Array,
    skipped: Callable[[], jax.Array],
    compute: Callable[[], jax.Array],
    branches: bool,
) -> jax.Array:
    """``skipped()`` when the scalar ``skip`` holds, else ``compute()``. ``compute()`` is
    right for every row either way (``skipped`` is only a shortcut), so without ``branches``
    it simply always runs."""
    if not branches:
        return compute()
    out: jax.Array = lax.cond(skip, skipped, compute)
    return out


def _scaled_and_kept(
    x: jax.Array, a: SamplingArrays, probe: int, branches: bool
) -> tuple[jax.Array, jax.Array]:
    """Logits times 1 / temperature, and the kept mask (finite, top-k, top-p)."""
    # Times the f32 reciprocal, stated (XLA would rewrite a division by a row's scalar so).
    # + 0.0 turns -0.0 into 0.0, so that value order is bit-key order (_key).
    inv_t = 1.0 / jnp.where(a.greedy, 1.0, a.temperature)
    s = x * inv_t[:, None] + 0.0
    k = jnp.where(a.greedy, 0, a.top_k)
    p = jnp.where(a.greedy, 1.0, a.top_p)
    none = jnp.full(x.shape[:1], -jnp.inf, F32)
    no_filter = ~jnp.any((k > 0) | (p < 1.0))
    thr = _unless(no_filter, lambda: none, lambda: _threshold(s, k, p, probe, branches), branches)
    return s, (s >= thr[:, None]) & (s > -jnp.inf)


def _threshold(s: jax.Array, k: jax.Array, p: jax.Array, probe: int, branches: bool) -> jax.Array:
    """(B,) the smallest scaled logit a row keeps under top-k then top-p (-inf: all)."""
    n = min(probe, s.shape[1])
    # The barrier keeps top_k a TopK op: without it XLA:CPU fused the slice of its
    # sort-based expansion into the users and ran a full (B, V) sort (60x slower at B=32).
    cand: jax.Array = lax.optimization_barrier(  # type: ignore[no-untyped-call]
        lax.top_k(s, n)[0]
    )  # (B, n), descending
    tk = jnp.where(k > 0, _take(cand, jnp.clip(k - 1, 0, n - 1)), -jnp.inf)
    big_k = k > n
    tk = _unless(
        ~jnp.any(big_k),
        lambda: tk,
        lambda: jnp.where(big_k, _bisect(s, jnp.ones_like(s), k.astype(F32)), tk),
        branches,
    )
    m = cand[:, :1]
    e = jnp.where(s >= tk[:, None], jnp.exp(s - m), 0.0)
    target = p * e.sum(-1)  # top_p of the top-k mass
    cum = jnp.cumsum(jnp.where(cand >= tk[:, None], jnp.exp(cand - m), 0.0), -1)
    reach = cum >= target[:, None]
    tp = jnp.where(p < 1.0, _take(cand, _first_true(reach, n - 1)), -jnp.inf)
    slow = (p < 1.0) & ~reach[:, -1]  # the nucleus does not end within the probe
    tp = _unless(
        ~jnp.any(slow), lambda: tp, lambda: jnp.where(slow, _bisect(s, e, target), tp), branches
    )
    return jnp.maximum(tk, tp)


def _bisect(s: jax.Array, weight: jax.Array, target: jax.Array) -> jax.Array:
    """(B,) the largest value v in each row with sum(weight[s >= v]) >= target, found by
    bisection over the order-preserving integer key of the f32 bits (32 steps, exact)."""
    keys = _key(s)
    lo = jnp.full(s.shape[:1], _key(jnp.array(-jnp.inf, F32)), I32)
    hi = keys.max(-1)

    def step(_: int, lh: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        lo, hi = lh
        mid = (lo | hi) - ((lo ^ hi) >> 1)  # ceil((lo + hi) / 2) without overflow
        ok = jnp.where(keys >= mid[:, None], weight, 0.0).sum(-1) >= target
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid - 1)

    lo, _ = lax.fori_loop(0, 32, step, (lo, hi))
    return _key(lo, inverse=True)


def _key(x: jax.Array, inverse: bool = False) -> jax.Array:
    """f32 <-> int32 whose integer order is the float order (negative floats' low 31 bits
    flipped; the map is its own inverse on the bits)."""
    b = x if inverse else lax.bitcast_convert_type(x, I32)
    k = jnp.where(b < 0, b ^ 0x7FFFFFFF, b)
    out: jax.Array = lax.bitcast_convert_type(k, F32) if inverse else k
    return out


def _uniforms(key: jax.Array, n: jax.Array) -> jax.Array:
    """(B,) uniform [0, 1) from each row's key folded with its output index."""

    def one(kd: jax.Array, i: jax.Array) -> jax.Array:
        k = jax.random.fold_in(jax.random.wrap_key_data(kd, impl=_KEY_IMPL), i)
        return jax.random.uniform(k, (), F32)

    return jax.vmap(one)(key, n)


def _draw(w: jax.Array, u: jax.Array, block: int) -> jax.Array:
    """(B,) inverse-CDF draw from weights ``w`` (B, V) >= 0 with uniforms ``u``: block sums
    find the block, a scan inside it finds the id. Only ids with w > 0 are returned (rounding
    can only move the pick to a neighbouring kept id)."""
    b, v = w.shape
    nb = -(-v // block)
    wb = jnp.pad(w, ((0, 0), (0, nb * block - v))).reshape(b, nb, block)
    sums = wb.sum(-1)
    cum = jnp.cumsum(sums, -1)
    x = u * cum[:, -1]
    j = _first_true((cum > x[:, None]) & (sums > 0), _last_true(sums > 0))
    base = jnp.where(j > 0, _take(cum, jnp.maximum(j - 1, 0)), 0.0)
    q = jnp.take_along_axis(wb, j[:, None, None], axis=1)[:, 0]
    c = base[:, None] + jnp.cumsum(q, -1)
    i = _first_true((c > x[:, None]) & (q > 0), _last_true(q > 0))
    return (j * block + i).astype(I32)


def _first_true(mask: jax.Array, fallback: jax.Array | int) -> jax.Array:
    """(B,) the first True column of each row, else ``fallback`` (an int min-reduction:
    much cheaper than argmax's variadic reduction on XLA:CPU)."""
    n = mask.shape[-1]
    idx = jnp.where(mask, lax.broadcasted_iota(I32, mask.shape, 1), n).min(-1)
    return jnp.where(idx == n, fallback, idx)


def _last_true(mask: jax.Array) -> jax.Array:
    """(B,) the last True column of each row (0 when none)."""
    idx = jnp.where(mask, lax.broadcasted_iota(I32, mask.shape, 1), -1).max(-1)
    return jnp.maximum(idx, 0)


def _take(x: jax.Array, idx: jax.Array) -> jax.Array:
    return jnp.take_along_axis(x, idx[:, None], axis=1)[:, 0]
