"""Device-side sampling (``local_tier/jax/device_sampling.py``) on CPU JAX, checked against
the host sampler's rules (``local_tier/jax/sampling.py``) on the same logits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from local_tier.jax import device_sampling as D
from local_tier.jax.api import SamplingParams
from local_tier.jax.sampling import Sampler, _nucleus, apply_repetition_penalty

SAMPLE = jax.jit(D.sample, static_argnames=("probe", "block", "branches"))
STEP = jax.jit(D.sample_and_advance, static_argnames=("probe", "block", "branches"))
SUPPORT = jax.jit(D.support, static_argnames=("probe",))
PROCESSED = jax.jit(D.processed_logits)


def row(
    params: SamplingParams,
    n: int = 0,
    end: Sequence[int] = (),
    seen: Sequence[int] = (),
) -> D.RowState:
    key = D.key_data_for_seed(params.seed if params.seed is not None else 0)
    return D.RowState(params, key, n, end, seen)


def arrays(rows: Sequence[D.RowState | None], batch: int, vocab: int) -> D.SamplingArrays:
    return D.build_arrays(rows, batch, vocab, end_width=4)


def run_steps(logits: Sequence[np.ndarray], a: D.SamplingArrays, **kw: Any) -> np.ndarray:
    """Tokens (steps, B) of consecutive decode steps, state folded on the device."""
    out = []
    for x in logits:
        tokens, a = STEP(x, a, **kw)
        out.append(np.asarray(tokens))
    return np.stack(out)


def softmax(x: np.ndarray) -> np.ndarray:
    p = np.exp(x.astype(np.float64) - x.max())
    out: np.ndarray = p / p.sum()
    return out


@pytest.mark.parametrize("seed", [0, 1, 42, 2**31, 2**32 - 1])
def test_host_key_data_is_jax_key_data(seed: int) -> None:
    want = jax.random.key_data(jax.random.key(seed, impl="threefry2x32"))
    assert np.array_equal(D.key_data_for_seed(seed), np.asarray(want))


def test_unseeded_rows_draw_their_key_from_the_engine_generator() -> None:
    rng = np.random.default_rng(5)
    a, b = D.row_key(None, rng), D.row_key(None, rng)
    assert not np.array_equal(a, b)
    assert np.array_equal(a, D.row_key(None, np.random.default_rng(5)))
    assert np.array_equal(D.row_key(9, rng), D.key_data_for_seed(9))


def test_padding_rows_and_neutral_values() -> None:
    a = D.build_arrays([row(SamplingParams(top_k=500, top_p=0.5, seed=1))], 3, 100)
    assert a.greedy.tolist() == [False, True, True]
    assert a.top_k.tolist() == [0, 0, 0]  # top_k >= vocab is off
    assert a.top_p.tolist() == [0.5, 1.0, 1.0]
    assert a.end_ids.shape == (3, 4) and (a.end_ids == D.NO_ID).all()
    with pytest.raises(ValueError, match="end_width"):
        D.build_arrays([row(SamplingParams(), end=range(5))], 1, 100, end_width=4)
    with pytest.raises(ValueError, match="do not fit"):
        D.build_arrays([None, None], 1, 100)


def test_greedy_rows_take_the_argmax_in_a_mixed_batch() -> None:
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(64, 1000)) * 3).astype(np.float32)
    rows = [
        row(SamplingParams(temperature=0.0)),
        row(SamplingParams(temperature=1.0, top_k=1, seed=3)),
        row(SamplingParams(temperature=1e-6, seed=4)),  # below vLLM's eps: greedy
        row(SamplingParams(temperature=1.0, top_p=0.3, seed=5)),  # a sampling neighbour
        None,
    ]
    a = arrays(rows, 64, 1000)
    assert a.greedy.tolist() == [True, True, True, False] + [True] * 60
    got = run_steps([x], a)[0]
    greedy = [0, 1, 2, *range(4, 64)]
    assert got[greedy].tolist() == np.argmax(x, -1)[greedy].tolist()
    # An all-greedy batch takes the short path: same ids.
    all_greedy = arrays(rows[:3], 64, 1000)
    assert run_steps([x], all_greedy)[0].tolist() == np.argmax(x, -1).tolist()


def test_low_temperature_tends_to_the_argmax() -> None:
    rng = np.random.default_rng(1)
    x = np.tile(rng.permutation(1000).astype(np.float32) * 0.05, (64, 1))  # gaps of 0.05
    rows = [row(SamplingParams(temperature=1e-3, seed=i)) for i in range(64)]
    a = arrays(rows, 64, 1000)
    assert not a.greedy.any()
    assert set(run_steps([x] * 3, a).ravel().tolist()) == {int(np.argmax(x[0]))}


@pytest.mark.parametrize(("top_k", "probe"), [(5, 64), (40, 16)])  # 40 > 16: bisection
def test_top_k_never_samples_outside_the_k_best(top_k: int, probe: int) -> None:
    rng = np.random.default_rng(2)
    x = np.tile(rng.normal(size=1000).astype(np.float32), (64, 1))
    best = set(np.argsort(-x[0])[:top_k].tolist())
    rows = [row(SamplingParams(temperature=3.0, top_k=top_k, seed=i)) for i in range(64)]
    seen = set(run_steps([x] * 8, arrays(rows, 64, 1000), probe=probe).ravel().tolist())
    assert seen <= best
    assert len(seen) >= min(top_k, 30)  # and it does sample among them


def host_nucleus(x: np.ndarray, temperature: float, top_k: int, top_p: float) -> set[int]:
    """The host sampler's kept set (sample_token's top-k, then _nucleus), in float64."""
    s = x.astype(np.float64) / temperature
    idx = np.arange(s.shape[0])
    if 0 < top_k < s.shape[0]:
        idx = np.argpartition(-s, top_k - 1)[:top_k]
    p = softmax(s[idx])
    order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order])
    # Keep the comparison meaningful: the nucleus edge is not within f32 rounding of top_p.
    j = int(np.searchsorted(cum, top_p))
    assert min(top_p - (cum[j - 1] if j else 0.0), cum[j] - top_p) > 1e-5
    return set(idx[_nucleus(p, top_p)].tolist())


@pytest.mark.parametrize(
    ("scale", "temperature", "top_k", "top_p"),
    [
        (6.0, 1.0, 0, 0.9),  # peaked: the nucleus ends within the probe
        (0.1, 1.0, 0, 0.5),  # flat: hundreds of tokens, found by bisection
        (0.1, 0.7, 0, 0.3),
        (2.0, 1.5, 50, 0.8),  # top-k first, top-p of the renormalized top-k mass
        (0.05, 1.0, 1000, 0.6),  # big k and a wide nucleus: both bisections
    ],
)
def test_top_p_support_equals_the_host_nucleus(
    scale: float, temperature: float, top_k: int, top_p: float
) -> None:
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(2, 5000)) * scale).astype(np.float32)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=1)
    a = arrays([row(params), row(params)], 2, 5000)
    got = np.asarray(SUPPORT(x, a))
    for r in range(2):
        want = host_nucleus(x[r], temperature, top_k, top_p)
        assert set(np.flatnonzero(got[r]).tolist()) == want
    draws = run_steps([x] * 20, a)
    for r in range(2):
        assert set(draws[:, r].tolist()) <= set(np.flatnonzero(got[r]).tolist())


def test_ties_at_the_threshold_are_all_kept() -> None:
    x = np.array([[3.0, 1.0, 2.0, 2.0, 2.0, 0.0]], np.float32)
    a = arrays([row(SamplingParams(top_k=2, seed=1))], 1, 6)
    assert np.flatnonzero(np.asarray(SUPPORT(x, a))[0]).tolist() == [0, 2, 3, 4]


def test_same_seed_same_tokens_whatever_the_batch_and_step() -> None:
    rng = np.random.default_rng(4)
    steps = [(rng.normal(size=(1, 2000)) * 1.5).astype(np.float32) for _ in range(6)]
    me = SamplingParams(temperature=0.9, top_p=0.95, seed=7)
    alone = run_steps(steps, arrays([row(me)], 1, 2000))[:, 0]

    def among(pos: int, neighbours: list[SamplingParams], start: int = 0) -> np.ndarray:
        rows = [row(p) for p in neighbours]
        rows.insert(pos, row(me, n=start))
        xs = []
        for x in steps[start:]:
            big = (rng.normal(size=(8, 2000)) * rng.uniform(0.05, 3)).astype(np.float32)
            big[pos] = x[0]
            xs.append(big)
        return run_steps(xs, arrays(rows, 8, 2000), probe=16)[:, pos]

    others = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, top_k=100, seed=1),  # bisection for top-k
        SamplingParams(temperature=2.0, top_p=0.5, seed=2),  # bisection for top-p
        SamplingParams(temperature=1.0, seed=3),
        SamplingParams(temperature=0.5, top_k=3, min_tokens=2, seed=4),
    ]
    assert among(5, others).tolist() == alone.tolist()
    assert among(0, others[1:3]).tolist() == alone.tolist()  # padding rows around it
    # Joining the batch at output index 3 gives the same 4th token onwards.
    assert among(2, others[3:], start=3).tolist() == alone[3:].tolist()


def test_different_seeds_give_different_tokens() -> None:
    x = np.zeros((64, 1000), np.float32)  # uniform: any two draws differ 99.9% of the time
    a = arrays([row(SamplingParams(seed=1)), row(SamplingParams(seed=2))], 64, 1000)
    out = run_steps([x] * 20, a)
    assert (out[:, 0] != out[:, 1]).sum() >= 15
    assert len(set(out[:, 0].tolist())) >= 15  # and steps differ within a row


def test_min_tokens_bans_the_end_ids_until_reached() -> None:
    x = np.full((64, 1000), -10.0, np.float32)
    x[:, :6] = [0.0, 5.0, 1.0, 4.9, 1.0, 0.5]
    end = (1, 3)  # EOS and a stop id: the two best tokens
    rows = [row(SamplingParams(temperature=0.0, min_tokens=3), end=end)] + [
        row(SamplingParams(temperature=2.0, min_tokens=3, seed=i), end=end) for i in range(32)
    ]
    out = run_steps([x] * 5, arrays(rows, 64, 1000))[:, :33]
    assert not np.isin(out[:3], end).any()
    assert out[:3, 0].tolist() == [2, 2, 2]  # greedy: best allowed (first of the ties)
    assert out[3:, 0].tolist() == [1, 1]  # min_tokens reached: EOS wins again
    assert np.isin(out[3:, 1:], end).any()


def test_repetition_penalty_equals_the_host_rule() -> None:
    rng = np.random.default_rng(6)
    x = (rng.normal(size=(3, 500)) * 4).astype(np.float32)
    prompt = rng.integers(0, 500, size=40).tolist()
    pens = [1.3, 0.7, 1.0]
    rows = [
        row(SamplingParams(repetition_penalty=pen, min_tokens=2, seed=1), end=[7], seen=prompt)
        for pen in pens
    ]
    a = arrays(rows, 3, 500)
    got = np.asarray(PROCESSED(x, a))
    for r, pen in enumerate(pens):
        want = x[r].copy()
        want[7] = -np.inf
        seen = np.zeros(500, bool)
        seen[prompt] = True
        if pen != 1.0:
            apply_repetition_penalty(want, seen, pen)  # f32 array: NumPy divides in f32
        assert np.array_equal(got[r], want)  # bit for bit, same f32 rule
        host = Sampler(rows[r].params, prompt, {7}).processed(x[r], [])
        np.testing.assert_allclose(got[r], host, rtol=1e-6)
    # After a step the drawn token counts as seen (and min_tokens no longer bans at 2).
    a = D.advance(D.advance(a, jax.numpy.array([11, 12, 13])), jax.numpy.array([21, 22, 23]))
    got = np.asarray(PROCESSED(x, a))
    for r in range(3):
        outs = [11 + r, 21 + r]
        host = Sampler(rows[r].params, prompt, {7}).processed(x[r], outs)
        np.testing.assert_allclose(got[r], host, rtol=1e-6)
    assert np.asarray(a.num_generated).tolist() == [2, 2, 2]


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return float((((counts - expected) ** 2) / expected).sum())


@pytest.mark.parametrize(
    ("params", "kept"),
    [
        (SamplingParams(temperature=0.7), [0, 1, 2, 3, 4, 5, 6, 7]),
        (SamplingParams(temperature=1.2, top_k=4, top_p=0.8), [0, 1, 2]),
    ],
)
def test_draws_follow_the_softmax(params: SamplingParams, kept: list[int]) -> None:
    logits = np.log(np.array([0.3, 0.2, 0.15, 0.12, 0.1, 0.07, 0.04, 0.02], np.float32))
    n_rows, n_steps = 2000, 10  # 20000 draws; fixed seeds, so the test is deterministic
    rows = [row(msgspec.structs.replace(params, seed=i)) for i in range(n_rows)]
    out = run_steps([np.tile(logits, (n_rows, 1))] * n_steps, arrays(rows, n_rows, 8))
    counts = np.bincount(out.ravel(), minlength=8)
    assert counts[[i for i in range(8) if i not in kept]].sum() == 0
    p = softmax(logits[kept] / params.temperature)
    # df <= 7: P(chi2 > 40) < 1e-5 for a correct sampler; a wrong one lands in the hundreds.
    assert chi_square(counts[kept].astype(np.float64), p) < 40


VOCAB = 300
LOGIT = st.one_of(
    st.sampled_from([-np.inf, 0.0, 1.0, 2.0]),  # ties and masked ids
    st.floats(-20, 20, width=32),
)
ROW = st.fixed_dictionaries(
    {
        "temperature": st.sampled_from([0.0, 0.3, 1.0, 2.5]),
        "top_k": st.sampled_from([0, 1, 3, 10, 50]),
        "top_p": st.sampled_from([0.1, 0.5, 0.9, 1.0]),
        "min_tokens": st.integers(0, 2),
        "repetition_penalty": st.sampled_from([1.0, 1.5, 0.6]),
        "seed": st.integers(0, 2**32 - 1),
    }
)


@settings(max_examples=60, deadline=None)
@given(
    logits=st.lists(st.lists(LOGIT, min_size=VOCAB, max_size=VOCAB), min_size=4, max_size=4),
    params=st.lists(ROW, min_size=4, max_size=4),
    n=st.integers(0, 3),
    ends=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=3),
    seen=st.lists(st.integers(0, VOCAB - 1), max_size=20),
)
def test_sampled_tokens_stay_in_the_allowed_support(
    logits: list[list[float]],
    params: list[dict[str, Any]],
    n: int,
    ends: list[int],
    seen: list[int],
) -> None:
    x = np.array(logits, np.float32)
    x[:, 5] = 3.0  # at least one finite logit that no end id bans (ends may cover it: below)
    ends = [e for e in ends if e != 5]
    rows = [row(SamplingParams(**p), n=n, end=ends, seen=seen) for p in params]
    a = arrays(rows, 4, VOCAB)
    got = np.asarray(SAMPLE(x, a, probe=8, block=16))  # small probe and block: every path
    for r, (tok, rs) in enumerate(zip(got.tolist(), rows, strict=True)):
        check_allowed(x[r], rs, tok)


def check_allowed(x: np.ndarray, rs: D.RowState, tok: int) -> None:
    """``tok`` is what the rules allow: the argmax for a greedy row, else a finite id within
    the k best values and inside the nucleus (up to f32 rounding at its edge)."""
    p = rs.params
    z = x.copy()
    if rs.num_generated < p.min_tokens:
        z[list(rs.end_ids)] = -np.inf
    if p.repetition_penalty != 1.0:
        mask = np.zeros(z.shape[0], bool)
        mask[list(rs.seen_ids)] = True
        apply_repetition_penalty(z, mask, p.repetition_penalty)
    if p.temperature < D.GREEDY_EPS or p.top_k == 1:
        assert tok == int(np.argmax(z))
        return
    s = (z * (np.float32(1) / np.float32(p.temperature))).astype(np.float64)
    assert np.isfinite(s[tok])
    if p.top_k > 0:
        assert s[tok] >= np.sort(s)[::-1][p.top_k - 1]
        s = np.where(s >= np.sort(s)[::-1][p.top_k - 1], s, -np.inf)
    prob = softmax(s)
    assert prob[s > s[tok]].sum() < p.top_p + 1e-4


def test_steps_run_inside_a_device_loop() -> None:
    """A lax.scan of sample + advance (no host between steps) gives the host-driven tokens."""
    rng = np.random.default_rng(8)
    xs = (rng.normal(size=(6, 64, 1000)) * 2).astype(np.float32)
    rows = [
        row(SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.3, seed=i), seen=[1])
        for i in range(64)
    ]
    a = arrays(rows, 64, 1000)

    def body(st: D.SamplingArrays, x: jax.Array) -> tuple[D.SamplingArrays, jax.Array]:
        tokens, st = D.sample_and_advance(x, st)
        return st, tokens

    final, tokens = jax.jit(lambda a, xs: jax.lax.scan(body, a, xs))(a, xs)
    assert np.array_equal(np.asarray(tokens), run_steps(list(xs), a))
    assert np.asarray(final.num_generated).tolist() == [6] * 64
    assert np.asarray(final.seen)[np.arange(64), np.asarray(tokens)[-1]].all()


def test_put_rows_replaces_only_the_named_rows() -> None:
    rng = np.random.default_rng(9)
    x = (rng.normal(size=(64, 1000)) * 2).astype(np.float32)
    old = [row(SamplingParams(temperature=0.0)) for _ in range(64)]
    a = jax.device_put(arrays(old, 64, 1000))
    joining = row(SamplingParams(top_k=3, repetition_penalty=1.2, seed=1), n=2, seen=[4])
    b = jax.jit(D.put_rows)(a, jax.numpy.array([7, 64]), arrays([joining], 2, 1000))  # 64: dropped
    assert np.asarray(b.greedy).tolist() == [True] * 7 + [False] + [True] * 56
    assert int(b.top_k[7]) == 3 and int(b.num_generated[7]) == 2 and bool(b.seen[7, 4])
    fresh = arrays([*old[:7], joining], 64, 1000)
    assert np.array_equal(run_steps([x], b)[0], run_steps([x], fresh)[0])


def test_advance_leaves_rows_that_did_not_sample() -> None:
    rows = [row(SamplingParams(repetition_penalty=1.5, seed=i)) for i in range(3)]
    a = D.advance(arrays(rows, 3, 10), jax.numpy.array([4, 5, 6]), jax.numpy.array([1, 0, 1], bool))
    assert np.asarray(a.num_generated).tolist() == [1, 0, 1]
    assert np.flatnonzero(np.asarray(a.seen)).tolist() == [4, 26]  # rows 0 and 2 only


def test_without_branches_the_tokens_are_the_same_and_no_conditional_is_left() -> None:
    """branches=False (for GPUs, where a conditional waits for the stream) computes every
    part and selects per row: same tokens, and the compiled step has no conditional."""
    rng = np.random.default_rng(10)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, top_k=100, seed=1),  # bisection (probe 16)
        SamplingParams(temperature=2.0, top_p=0.5, seed=2),  # bisection
        SamplingParams(temperature=1.0, seed=3),
        SamplingParams(temperature=0.5, top_k=3, top_p=0.9, seed=4),
        SamplingParams(temperature=0.7, repetition_penalty=1.4, min_tokens=2, seed=5),
    ]
    a = arrays([row(p, end=[0], seen=[1, 2]) for p in params], 8, 2000)
    xs = [(rng.normal(size=(8, 2000)) * 2).astype(np.float32) for _ in range(4)]
    want = run_steps(xs, a, probe=16)
    assert np.array_equal(run_steps(xs, a, probe=16, branches=False), want)
    hlo = str(STEP.lower(xs[0], a, probe=16, branches=False).compile().as_text())
    assert "conditional(" not in hlo
    assert "conditional(" in str(STEP.lower(xs[0], a, probe=16).compile().as_text())
