"""The compile plan: which step shapes exist, the cover compiled before ready, and which
compiled shape serves a plan. The property test drives the real scheduler with random
traffic and checks that every plan it makes fits a shape of the cover."""

from __future__ import annotations

import random
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from local_tier.jax.buckets import Buckets, round_up
from local_tier.jax.compile_plan import (
    READY_SLACK,
    BackgroundCompiler,
    CompilePlan,
    PlanSpace,
    Shape,
    background_order,
    contains,
    cover,
    decode_need,
    possible_shapes,
    prefill_need,
    reachable,
    ready_set,
    serving_shape,
    step_cost,
)
from local_tier.jax.kv_cache import BlockPool
from local_tier.jax.scheduler import Scheduler, Sequence, StepPlan

DEFAULT = Buckets.build(32, 2048, 512, min_decode_batch=2, block_size=16)


C = DEFAULT.context  # every step's block table: 2048 tokens


def test_default_plan_compiles_every_decode_shape_and_a_prefill_cover_before_ready() -> None:
    plan = CompilePlan.build(PlanSpace(DEFAULT, 32, 512, 2048))
    largest = {(32, 1, C), (1, 512, C), (2, 256, C), (4, 128, C), (8, 64, C)}
    assert set(cover(plan.shapes)) == largest
    decode = {(b, 1, C) for b in (2, 4, 8, 16, 32)}
    assert largest | decode < set(plan.ready) and len(plan.ready) == 13
    assert set(plan.ready) | set(plan.background) == set(plan.shapes)
    assert not set(plan.ready) & set(plan.background)
    # decode: 5 batch buckets; prefill: 14 (rows, chunk) pairs; the context is no dimension
    assert len(plan.shapes) == 5 + 14 and {p for _, _, p in plan.shapes} == {C}


def test_possible_shapes_follow_the_limits() -> None:
    shapes = possible_shapes(PlanSpace(DEFAULT, 3, 100, 300))
    decode = {s for s in shapes if s[1] == 1}
    assert decode == {(2, 1, C), (4, 1, C)}  # 3 sequences pad to 4 rows at most
    prefill = {s for s in shapes if s[1] > 1}
    assert {t for _, t, _ in prefill} == {32, 64, 128}  # a 100-token budget pads to 128
    assert all(r == 1 or r * t <= 100 for r, t, _ in prefill)
    assert max(r for r, _, _ in prefill) == 2  # 3 rows would need 4 x 32 > 100


@given(
    st.lists(st.integers(0, 300), min_size=1, max_size=8, unique=True),
    st.integers(0, 300),
    st.integers(0, 300),
)
def test_reachable_equals_rounding_every_value(vals: list[int], lo: int, span: int) -> None:
    buckets = tuple(sorted(vals))
    hi = min(lo + span, buckets[-1])
    want = sorted({round_up(v, buckets) for v in range(lo, hi + 1)})
    assert reachable(buckets, lo, hi) == want


def test_serving_shape_prefers_the_exact_then_the_cheapest_container() -> None:
    compiled = [(32, 1, C), (8, 1, C), (4, 1, C), (8, 64, C)]
    assert serving_shape((8, 1, C), compiled) == (8, 1, C)
    assert serving_shape((2, 1, C), compiled) == (4, 1, C)
    assert serving_shape((16, 1, C), compiled) == (32, 1, C)
    # a decode plan never runs in a prefill shape (other weights), nor the reverse
    assert serving_shape((1, 32, C), [(32, 1, C)]) is None
    assert serving_shape((2, 1, C), [(8, 64, C)]) is None


def test_background_order_skips_the_done_and_puts_larger_shapes_first() -> None:
    shapes = [(2, 1, C), (8, 1, C), (1, 32, C), (2, 64, C), (16, 1, C)]
    order = background_order(shapes, done=[(16, 1, C)])
    assert order == [(2, 64, C), (1, 32, C), (8, 1, C), (2, 1, C)]


@given(
    st.integers(1, 40),
    st.integers(2, 600),
    st.integers(1, 300),
    st.sampled_from([1, 2]),
    st.sampled_from([4, 16]),
    st.sampled_from([1.0, 2.0, 4.0]),
)
def test_cover_contains_every_possible_shape(
    rows: int, max_len: int, budget: int, min_batch: int, bs: int, slack: float
) -> None:
    bk = Buckets.build(rows, max_len, budget, min_batch, bs)
    shapes = possible_shapes(PlanSpace(bk, rows, budget, max_len))
    first = cover(shapes)
    assert all(any(contains(c, s) for c in first) for s in shapes)
    assert not any(a != b and contains(a, b) for a in first for b in first)  # minimal
    ready = ready_set(shapes, slack)
    assert set(first) <= set(ready)
    for s in shapes:
        assert any(contains(c, s) and step_cost(c) <= slack * step_cost(s) for c in ready)
    plan = CompilePlan.build(PlanSpace(bk, rows, budget, max_len), slack)
    assert {s for s in shapes if s[1] == 1} <= set(plan.ready)  # decode runs exact shapes


def _simulate(sched: Scheduler, rng: random.Random, requests: list[Sequence]) -> list[StepPlan]:
    """Feed ``requests`` at random steps and run the scheduler to the end, as the engine
    does after each device step; returns every plan it made."""
    plans: list[StepPlan] = []
    pending = list(requests)
    for _ in range(5000):
        while pending and rng.random() < 0.4:
            sched.add(pending.pop(0))
        plan = sched.schedule()
        if plan is None:
            if not pending:
                return plans
            continue
        plans.append(plan)
        work = (
            [(s, 1, True) for s in plan.decode]
            if plan.kind == "decode"
            else [(i.seq, i.length, i.sample) for i in plan.prefill]
        )
        for seq, n, sample in work:
            sched.computed(seq, n)
            if sample:
                seq.output_ids.append(rng.randrange(1000))
                if len(seq.output_ids) >= seq.max_tokens:
                    sched.finish(seq)
    raise AssertionError("the simulation did not finish")


@settings(max_examples=60, deadline=None)
@given(
    max_rows=st.integers(1, 12),
    max_len=st.integers(40, 400),
    budget=st.integers(8, 128),
    bs=st.sampled_from([4, 8, 16]),
    blocks=st.integers(12, 80),
    seed=st.integers(0, 10**6),
)
def test_every_plan_the_scheduler_makes_fits_the_cover(
    max_rows: int, max_len: int, budget: int, bs: int, blocks: int, seed: int
) -> None:
    rng = random.Random(seed)
    bk = Buckets.build(max_rows, max_len, budget, rng.choice([1, 2]), bs)
    if rng.random() < 0.3:  # one overridden chunk bucket, possibly above the budget
        bk = bk.override(prefill_len=(budget + 8 * rng.randint(0, 4),))
    pool = BlockPool(blocks, bs)
    sched = Scheduler(pool, bk, max_rows, budget, background_prefill_budget=rng.randint(1, 64))
    space = PlanSpace.of(sched, max_len)
    plan = CompilePlan.build(space)
    limit = space.limit
    shared = [rng.randrange(1000) for _ in range(limit)]
    requests = []
    for k in range(rng.randint(1, 14)):
        n = rng.randint(1, limit - 1)
        ids = shared[:n] if rng.random() < 0.5 else [rng.randrange(1000) for _ in range(n)]
        max_tokens = rng.randint(1, limit - n)
        requests.append(Sequence(f"r{k}", ids, max_tokens, priority=rng.choice([0, 0, 1])))
    for p in _simulate(sched, rng, requests):
        need = decode_need(bk, p.decode) if p.kind == "decode" else prefill_need(bk, p.prefill)
        assert need in plan.shapes
        assert serving_shape(need, cover(plan.shapes)) is not None
        served = serving_shape(need, plan.ready)
        assert served is not None and step_cost(served) <= READY_SLACK * step_cost(need)


def test_background_compiler_waits_while_busy_and_stops() -> None:
    polls: list[int] = []
    done: list[tuple[Shape, int]] = []

    def busy() -> bool:  # busy for the first three polls
        polls.append(1)
        return len(polls) <= 3

    shapes = [(2, 1, 64), (4, 1, 64)]
    bg = BackgroundCompiler(lambda s: done.append((s, len(polls))), shapes, lambda _m: None, busy)
    bg.start()
    bg._thread.join(30)
    assert [s for s, _ in done] == shapes and bg.done == 2 and bg.error is None
    assert done[0][1] == 4  # the first compile waited until busy() said no

    def boom(_s: Shape) -> None:
        raise RuntimeError("no")

    msgs: list[str] = []
    failing = BackgroundCompiler(boom, shapes, msgs.append)
    failing.start()
    failing.stop(30)
    assert isinstance(failing.error, RuntimeError) and "failed" in msgs[0]
    assert failing.done == 0 and not failing.running


def test_a_shape_served_padded_jumps_the_queue_but_waits_for_an_idle_engine() -> None:
    """``prefer``: the shape a plan needs right now compiles before the others (unknown and
    already compiled shapes are ignored), but like them only while the engine is idle."""
    order: list[Shape] = [(2, 1, 64), (2, 1, 128), (4, 1, 256)]
    done: list[Shape] = []
    busy = [True]
    bg = BackgroundCompiler(done.append, order, lambda _m: None, lambda: busy[0], max_defer_s=600)
    bg.prefer((9, 9, 9))
    bg.prefer((4, 1, 256))
    bg.start()
    time.sleep(0.5)  # the thread polls busy() meanwhile; nothing may compile
    assert done == []
    busy[0] = False
    bg._thread.join(30)
    assert done == [(4, 1, 256), (2, 1, 64), (2, 1, 128)]
