"""Priority scheduling in the JAX engine's scheduler: batch items (priority 1) pause while
interactive requests (priority 0) run, give up slots and blocks to them, and resume where
they were."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from local_tier.jax.buckets import Buckets
from local_tier.jax.kv_cache import BlockPool
from local_tier.jax.scheduler import Scheduler, Sequence, Status, StepPlan

BS = 4


def make(num_blocks: int = 16, max_running: int = 4, budget: int = 8) -> Scheduler:
    buckets = Buckets.build(max_running, 64, budget, block_size=BS)
    return Scheduler(BlockPool(num_blocks, BS), buckets, max_running, budget)


def step(s: Scheduler) -> StepPlan:
    """Plan one step and do what the engine does after it (one sampled token per row)."""
    plan = s.schedule()
    assert plan is not None
    if plan.kind == "decode":
        for seq in plan.decode:
            s.computed(seq, 1)
            seq.output_ids.append(7)
    else:
        for item in plan.prefill:
            s.computed(item.seq, item.length)
            if item.sample:
                item.seq.output_ids.append(7)
    return plan


def planned(plan: StepPlan) -> set[str]:
    rows = plan.decode if plan.kind == "decode" else [i.seq for i in plan.prefill]
    return {s.request_id for s in rows}


def test_batch_pauses_while_an_interactive_request_runs_and_resumes_after() -> None:
    s = make()
    batch = [Sequence(f"b{i}", [i + 1, i + 2], max_tokens=50, priority=1) for i in range(2)]
    for seq in batch:
        s.add(seq)
    while any(b.needs_prefill for b in batch):
        step(s)  # batch prefill
    assert planned(step(s)) == {"b0", "b1"}  # batch decodes
    made = [len(b.output_ids) for b in batch]
    chat = Sequence("chat", [9, 9, 9], max_tokens=3)
    s.add(chat)
    first = step(s)
    assert first.kind == "prefill" and planned(first) == {"chat"}  # right away
    while chat.status is not Status.FINISHED:
        assert planned(step(s)) == {"chat"}  # the batch is paused, not in any step
        if len(chat.output_ids) >= chat.max_tokens:
            s.finish(chat)
    assert [len(b.output_ids) for b in batch] == made  # nothing ran for the batch meanwhile
    assert all(b.status is Status.RUNNING for b in batch)  # paused in place, blocks kept
    assert planned(step(s)) == {"b0", "b1"}  # and it resumes where it was


def test_interactive_request_takes_the_slot_of_the_newest_batch_item() -> None:
    s = make(max_running=2)
    old, new = (Sequence(n, [1, 2], max_tokens=9, priority=1) for n in ("old", "new"))
    s.add(old)
    s.add(new)
    step(s)
    chat = Sequence("chat", [5], max_tokens=2)
    s.add(chat)
    plan = step(s)
    assert planned(plan) == {"chat"}
    assert new.status is Status.WAITING and old.status is Status.RUNNING
    assert s.num_preemptions == 1


def test_interactive_request_takes_blocks_from_batch_items() -> None:
    s = make(num_blocks=4, max_running=4)  # 16 tokens of KV
    hog = Sequence("hog", list(range(12)), max_tokens=4, priority=1)  # 3 blocks
    s.add(hog)
    step(s)
    chat = Sequence("chat", list(range(100, 108)), max_tokens=2)  # needs 2, 1 free
    s.add(chat)
    plan = step(s)
    assert planned(plan) == {"chat"} and hog.status is Status.WAITING


def test_an_interactive_request_never_preempts_another_interactive_one() -> None:
    s = make(max_running=1)
    first, second = Sequence("a", [1], max_tokens=5), Sequence("b", [2], max_tokens=5)
    s.add(first)
    step(s)
    s.add(second)
    step(s)
    assert first.status is Status.RUNNING and second.status is Status.WAITING
    assert s.num_preemptions == 0


def test_decode_memory_is_taken_from_batch_items_first() -> None:
    s = make(num_blocks=3, max_running=4)
    chat = Sequence("chat", [1, 2, 3], max_tokens=9)  # will need a second block
    batch = Sequence("batch", [4, 5, 6, 7, 8], max_tokens=9, priority=1)  # 2 blocks
    s.add(chat)
    s.add(batch)
    step(s)  # both prefilled: 3 blocks used
    step(s)  # chat decodes its 4th token into its first block
    step(s)  # chat's 5th token needs a new block: the paused batch item gives it up
    assert chat.status is Status.RUNNING and batch.status is Status.WAITING


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        # prompt + output <= 16 tokens: every request fits the smallest pool (the engine
        # refuses one that never could)
        st.tuples(st.integers(0, 2), st.integers(1, 10), st.integers(1, 6)),
        min_size=1,
        max_size=8,
    ),
    st.integers(4, 12),
)
def test_every_step_serves_only_the_best_priority_and_all_finish(
    requests: list[tuple[int, int, int]], num_blocks: int
) -> None:
    """Whatever the mix and memory: each step plans only sequences of the best priority that
    runs, no request waits behind a worse one that holds a slot or blocks, and all finish."""
    s = make(num_blocks=num_blocks, max_running=3)
    seqs = [
        Sequence(f"r{i}", list(range(1, n + 1)), max_tokens=m, priority=p)
        for i, (p, n, m) in enumerate(requests)
    ]
    for seq in seqs:
        s.add(seq)
    for _ in range(500):
        if not s.has_work():
            break
        plan = step(s)
        assert {q.priority for q in planned_seqs(plan)} == {min(q.priority for q in s.running)}
        assert all(r.priority <= w.priority for r in s.running for w in s.waiting)
        for q in list(s.running):
            if len(q.output_ids) >= q.max_tokens:
                s.finish(q)
    assert all(q.status is Status.FINISHED for q in seqs)


def planned_seqs(plan: StepPlan) -> list[Sequence]:
    return plan.decode if plan.kind == "decode" else [i.seq for i in plan.prefill]


def test_batch_prefill_steps_are_cut_to_the_background_budget() -> None:
    buckets = Buckets.build(4, 64, 16, block_size=BS)
    s = Scheduler(BlockPool(32, BS), buckets, 4, 16, background_prefill_budget=4)
    batch = Sequence("batch", list(range(1, 13)), max_tokens=2, priority=1)
    s.add(batch)
    plan = step(s)
    assert [i.length for i in plan.prefill] == [4]  # 12 prompt tokens, 4 per step
    chat = Sequence("chat", list(range(101, 113)), max_tokens=2)
    s.add(chat)
    plan = step(s)
    assert [(i.seq.request_id, i.length) for i in plan.prefill] == [("chat", 12)]  # in one
