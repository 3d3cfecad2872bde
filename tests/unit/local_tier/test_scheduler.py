"""Continuous batching bookkeeping, without a model: admission, chunking, alternation,
preemption, prefix hits."""

from __future__ import annotations

import pytest

from local_tier.jax.buckets import Buckets, round_up
from local_tier.jax.kv_cache import BlockPool
from local_tier.jax.scheduler import Scheduler, Sequence, Status, StepPlan

BS = 4


def make(num_blocks: int = 16, max_running: int = 4, budget: int = 8) -> Scheduler:
    buckets = Buckets.build(max_running, 64, budget, block_size=BS)
    return Scheduler(BlockPool(num_blocks, BS), buckets, max_running, budget)


def run_step(s: Scheduler, plan: StepPlan, token: int = 7) -> None:
    """What the engine does after a device step: record computed tokens, append samples."""
    if plan.kind == "decode":
        for seq in plan.decode:
            s.computed(seq, 1)
            seq.output_ids.append(token)
    else:
        for item in plan.prefill:
            s.computed(item.seq, item.length)
            if item.sample:
                item.seq.output_ids.append(token)


def test_long_prompt_is_chunked_and_interleaved_with_decode() -> None:
    s = make(budget=8)
    short = Sequence("short", [1, 2, 3], max_tokens=5)
    s.add(short)
    plan = s.schedule()
    assert plan is not None and plan.kind == "prefill"
    run_step(s, plan)
    long = Sequence("long", list(range(20)), max_tokens=5)
    s.add(long)
    kinds = []
    for _ in range(6):
        plan = s.schedule()
        assert plan is not None
        kinds.append(plan.kind)
        if plan.kind == "prefill":
            assert all(i.length <= 8 for i in plan.prefill)
        run_step(s, plan)
    assert kinds == ["decode", "prefill", "decode", "prefill", "decode", "prefill"]
    assert long.num_computed == 20 and len(long.output_ids) == 1  # sampled at the last chunk
    assert short.num_computed == 3 + 3


def test_fifo_admission_waits_for_blocks_and_never_overtakes() -> None:
    s = make(num_blocks=4)  # 16 tokens
    big = Sequence("big", list(range(12)), max_tokens=4)  # 3 blocks
    s.add(big)
    run_step(s, s.schedule() or StepPlan("none"))
    blocked = Sequence("blocked", list(range(100, 108)), max_tokens=4)  # needs 2, 1 free
    small = Sequence("small", [1], max_tokens=1)  # would fit, but must not overtake
    s.add(blocked)
    s.add(small)
    s.schedule()
    assert blocked.status is Status.WAITING and small.status is Status.WAITING
    s.finish(big)
    plan = s.schedule()
    assert plan is not None and plan.prefill[0].seq is blocked
    assert blocked.status is Status.RUNNING and small.status is Status.RUNNING


def test_max_running_limits_the_batch() -> None:
    s = make(max_running=2)
    seqs = [Sequence(f"r{i}", [i + 1], max_tokens=3) for i in range(3)]
    for q in seqs:
        s.add(q)
    plan = s.schedule()
    assert plan is not None and len(s.running) == 2
    assert seqs[2].status is Status.WAITING


def test_decode_preempts_the_newest_when_blocks_run_out() -> None:
    s = make(num_blocks=2, max_running=2, budget=128)
    a = Sequence("a", [1, 2, 3, 4], max_tokens=8)
    b = Sequence("b", [5, 6, 7, 8], max_tokens=8)
    s.add(a)
    s.add(b)
    plan = s.schedule()
    assert plan is not None
    run_step(s, plan)  # both prompts computed, one output each, both blocks used
    plan = s.schedule()  # a needs a second block: b is preempted
    assert plan is not None and plan.kind == "decode" and plan.decode == [a]
    assert b.status is Status.WAITING and s.num_preemptions == 1 and b.output_ids == [7]
    assert s.waiting[0] is b
    s.finish(a)
    plan = s.schedule()  # b resumes: recompute the prompt, keep its output, do not resample
    assert plan is not None and plan.kind == "prefill"
    item = plan.prefill[0]
    assert (item.seq, item.start, item.length, item.sample) == (b, 0, 4, False)
    run_step(s, plan)
    plan = s.schedule()
    assert plan is not None and plan.decode == [b] and b.all_ids[b.num_computed] == 7


def test_prefix_cache_skips_shared_blocks() -> None:
    s = make()
    prompt = list(range(10))
    first = Sequence("first", prompt, max_tokens=2)
    s.add(first)
    run_step(s, s.schedule() or StepPlan("none"))
    s.finish(first)
    second = Sequence("second", [*prompt[:8], 50, 51, 52], max_tokens=2)
    s.add(second)
    plan = s.schedule()
    assert plan is not None and plan.prefill[0].start == 8 and plan.prefill[0].length == 3
    assert second.num_cached == 8
    assert s.prefix_queries == 21 and s.prefix_hits == 8


def test_whole_prompt_cached_still_computes_last_token() -> None:
    s = make()
    prompt = list(range(8))
    first = Sequence("first", prompt, max_tokens=2)
    s.add(first)
    run_step(s, s.schedule() or StepPlan("none"))
    s.finish(first)
    again = Sequence("again", prompt, max_tokens=2)
    s.add(again)
    plan = s.schedule()
    assert plan is not None and plan.prefill[0].start == 4 and plan.prefill[0].length == 4


def test_finish_frees_blocks() -> None:
    s = make()
    q = Sequence("q", list(range(9)), max_tokens=2)
    s.add(q)
    s.schedule()
    assert s.pool.num_used == 3
    s.finish(q)
    assert s.pool.num_used == 0 and not s.has_work()


def test_prefill_rows_share_one_padded_length_within_budget() -> None:
    s = make(max_running=4, budget=16)
    for i in range(4):
        s.add(Sequence(f"r{i}", list(range(i * 10, i * 10 + 3)), max_tokens=2))
    plan = s.schedule()
    assert plan is not None
    t = round_up(max(i.length for i in plan.prefill), s.buckets.prefill_len)
    assert round_up(len(plan.prefill), s.buckets.prefill_rows) * t <= 16


def test_buckets_round_up_and_override() -> None:
    b = Buckets.build(32, 2048, 512, min_decode_batch=2)
    assert b.decode_batch == (2, 4, 8, 16, 32)
    assert round_up(3, b.decode_batch) == 4
    assert b.prefill_len == (32, 64, 128, 256, 512) and b.prefill_rows == (1, 2, 4, 8)
    o = b.override(decode_batch=(32,), prefill_len=(64, 512))
    assert o.decode_batch == (32,) and o.prefill_len == (64, 512) and o.context == b.context
    with pytest.raises(ValueError, match="reach 32"):
        b.override(decode_batch=(2, 16))


def test_the_block_table_spans_max_model_len_in_whole_blocks() -> None:
    """The context is not bucketed: every step carries the whole table (attention reads only
    the chunks the rows fill), so it is max_model_len rounded up to whole blocks."""
    assert Buckets.build(32, 2048, 512, block_size=16).context == 2048
    assert Buckets.build(4, 100, 32, block_size=16).context == 112


def test_first_scheduled_is_stamped_once_and_survives_preemption() -> None:
    ticks = iter(range(100, 200))
    buckets = Buckets.build(2, 64, 128, block_size=BS)
    s = Scheduler(BlockPool(2, BS), buckets, 2, 128, clock=lambda: float(next(ticks)))
    a = Sequence("a", [1, 2, 3, 4], max_tokens=8)
    b = Sequence("b", [5, 6, 7, 8], max_tokens=8)
    s.add(a)
    s.add(b)
    assert {a.first_scheduled, b.first_scheduled} == {None}  # queued, not yet scheduled
    plan = s.schedule()
    assert plan is not None
    assert (a.first_scheduled, b.first_scheduled) == (100.0, 101.0)
    run_step(s, plan)
    s.schedule()  # a needs a second block: b is preempted back to the queue
    assert (b.status, b.first_scheduled) == (Status.WAITING, 101.0)
    s.finish(a)
    s.schedule()  # b is admitted again
    assert (b.status, b.first_scheduled) == (Status.RUNNING, 101.0)
    assert a.first_scheduled == 100.0
