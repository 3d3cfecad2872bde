"""Continuous batching: which sequences run in the next engine step. Pure bookkeeping.

Every step is either a *prefill* step (prompt chunks of one or more sequences) or a *decode*
step (one new token for every sequence whose prompt is done). Sequences join the running set
as soon as their prompt's blocks fit (FIFO within a priority: the queue head is never
overtaken by a request of its own priority, so nothing starves) and leave it the moment they
finish. While both kinds of work exist, the scheduler alternates them, and a prompt longer
than ``prefill_budget`` tokens is split into chunks, so a long prompt delays running streams
by at most one chunk per token and never blocks short requests from starting for long.

Priority (vLLM's convention: lower values first; 0 is interactive, the gateway runs batch
items at 1): only the best priority present among running sequences is planned, so lower
ones *pause* (they keep their blocks and resume where they were) while better work exists.
A better request that finds no free slot or no blocks preempts the worst running sequence of
a lower priority. So a batch slows an interactive request by at most the step that was
running when it arrived (on a level of its own, a new prompt's prefill runs next), and
prefill steps of priorities above 0 are cut to ``background_prefill_budget`` tokens to keep
that step short (a 512-token batch prefill step took ~280 ms on two CPU cores).

Memory: a sequence holds blocks for every token it has (prompt blocks are taken at admission,
one more block whenever decoding crosses a block boundary). When a decode step needs a block
and none is free, the most recently admitted sequence is preempted: its blocks are released
(their full blocks stay in the prefix cache, so resuming is mostly cache hits) and it goes
back to the head of the queue, keeping the tokens it already produced.

Timing: a sequence's ``first_scheduled`` is the clock reading when it first joined the
running set; preemption and resumption leave it alone, so queue time (arrival to first
scheduled) and prefill time (first scheduled to first token) match vLLM's definitions.
"""

from __future__ import annotations

import enum
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from local_tier.jax.buckets import Buckets, round_up
from local_tier.jax.kv_cache import ROOT_HASH, BlockPool, OutOfBlocksError


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_arrivals = itertools.count()


@dataclass(eq=False)
class Sequence:
    """One request's tokens and cache state."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    output_ids: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V is in the cache
    num_cached: int = 0  # prompt tokens served from the prefix cache at first admission
    hashes: list[int] = field(default_factory=list)  # chained hashes of registered blocks
    status: Status = Status.WAITING
    arrival: int = field(default_factory=lambda: next(_arrivals))
    admitted_once: bool = False
    first_scheduled: float | None = None  # clock reading at first admission; kept on preemption
    priority: int = 0  # lower runs first (0: interactive)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefill_target(self) -> int:
        """Tokens to prefill: the whole prompt, or (after preemption) all but the last token,
        which the next decode step feeds."""
        return self.num_tokens - (1 if self.output_ids else 0)

    @property
    def needs_prefill(self) -> bool:
        return self.num_computed < self.prefill_target


@dataclass
class PrefillItem:
    """Tokens ``seq.all_ids[start:start + length]``; ``sample`` when the chunk ends the prompt
    of a sequence that has produced nothing yet (its last logits give the first token)."""

    seq: Sequence
    start: int
    length: int
    sample: bool


@dataclass
class StepPlan:
    kind: str  # "prefill" | "decode"
    prefill: list[PrefillItem] = field(default_factory=list)
    decode: list[Sequence] = field(default_factory=list)


def _order(seq: Sequence) -> tuple[int, int]:
    """Service order: priority first (lower first), then arrival."""
    return seq.priority, seq.arrival


class Scheduler:
    """Admission, step planning, preemption and block registration for all sequences."""

    def __init__(
        self,
        pool: BlockPool,
        buckets: Buckets,
        max_running: int,
        prefill_budget: int,
        clock: Callable[[], float] = time.monotonic,
        *,
        background_prefill_budget: int | None = None,
    ):
        """``clock`` stamps ``Sequence.first_scheduled``; it must be the clock the caller
        measures arrival with (``time.monotonic`` in the worker).
        ``background_prefill_budget`` (default: ``prefill_budget``) bounds the prefill steps
        of priorities above 0: such a step may be running when an interactive request
        arrives, and it waits for that step."""
        self.pool = pool
        self.buckets = buckets
        self.max_running = max_running
        self.prefill_budget = prefill_budget
        self.background_prefill_budget = min(
            prefill_budget, background_prefill_budget or prefill_budget
        )
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # prompt tokens found there
        self._last_kind = "decode"
        self._clock = clock

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Retire ``seq`` (finished or aborted) wherever it is and free its blocks."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks = []
        seq.status = Status.FINISHED

    def schedule(self) -> StepPlan | None:
        """Plan the next step, or None when there is nothing to run."""
        self._admit()
        level = min((s.priority for s in self.running), default=0)
        active = [s for s in self.running if s.priority == level]
        prefill = [s for s in active if s.needs_prefill]
        decode = [s for s in active if not s.needs_prefill]
        budget = self.prefill_budget if level <= 0 else self.background_prefill_budget
        if prefill and (not decode or self._last_kind == "decode"):
            self._last_kind = "prefill"
            return StepPlan("prefill", prefill=self._plan_prefill(prefill, budget))
        if decode:
            decode = self._reserve_decode_blocks(decode)
            if decode:
                self._last_kind = "decode"
                return StepPlan("decode", decode=decode)
        if prefill:
            return StepPlan("prefill", prefill=self._plan_prefill(prefill, budget))
        return None

    def repeat_decode(self, seqs: list[Sequence]) -> StepPlan | None:
        """The decode step that follows one of ``seqs`` when nothing else may change it: no
        request waits, every running sequence is in ``seqs`` and decoding, and the blocks
        for their next tokens are free (no preemption). None otherwise; then ``schedule``
        decides. The one-step-behind loop chains steps through this."""
        if self.waiting or len(self.running) != len(seqs):
            return None
        if any(s.status is not Status.RUNNING or s.needs_prefill for s in seqs):
            return None
        bs = self.pool.block_size
        need = sum(1 for s in seqs if len(s.blocks) * bs <= s.num_computed)
        if need > self.pool.num_free:
            return None
        for s in seqs:
            if len(s.blocks) * bs <= s.num_computed:
                s.blocks.append(self.pool.allocate())
        self._last_kind = "decode"
        return StepPlan("decode", decode=list(seqs))

    def _admit(self) -> None:
        while self.waiting:
            seq = min(self.waiting, key=_order)
            if len(self.running) >= self.max_running or not self._take_blocks(seq):
                victim = self._worst_below(seq.priority)
                if victim is None:
                    return  # the head waits for a slot or memory; nobody overtakes it
                self._preempt(victim)
                continue
            self.waiting.remove(seq)
            seq.status = Status.RUNNING
            self.running.append(seq)
            if seq.first_scheduled is None:
                seq.first_scheduled = self._clock()

    def _worst_below(self, priority: int) -> Sequence | None:
        """The running sequence to make room with for a ``priority`` request: the latest
        arrival of the worst priority below it, or None when nothing runs below it."""
        lower = [s for s in self.running if s.priority > priority]
        return max(lower, key=_order) if lower else None

    def _take_blocks(self, seq: Sequence) -> bool:
        """Prefix-cache lookup plus blocks for the rest of the prefill; False if they don't
        fit now (then nothing is held)."""
        target = seq.prefill_target
        # Leave at least one token to compute: its logits are the next token's distribution.
        cached = self.pool.match_prefix(seq.all_ids, max(0, target - 1))
        bs = self.pool.block_size
        need = -(-target // bs) - len(cached)
        if need > self.pool.num_free:
            self.pool.release(cached)
            return False
        seq.blocks = cached + [self.pool.allocate() for _ in range(need)]
        seq.num_computed = len(cached) * bs
        seq.hashes = self._chain(seq, len(cached))
        if not seq.admitted_once:
            seq.admitted_once = True
            seq.num_cached = seq.num_computed
            self.prefix_queries += len(seq.prompt_ids)
            self.prefix_hits += seq.num_computed
        return True

    def _chain(self, seq: Sequence, n_blocks: int) -> list[int]:
        out, parent, bs, ids = [], ROOT_HASH, self.pool.block_size, seq.all_ids
        for i in range(n_blocks):
            parent = hash((parent, tuple(ids[i * bs : (i + 1) * bs])))
            out.append(parent)
        return out

    def _plan_prefill(self, seqs: list[Sequence], budget: int) -> list[PrefillItem]:
        items: list[PrefillItem] = []
        rows = self.buckets.prefill_rows
        longest = 0
        for seq in sorted(seqs, key=_order):
            length = min(seq.prefill_target - seq.num_computed, budget)
            padded = round_up(max(longest, length), self.buckets.prefill_len)
            if items and (
                len(items) + 1 > rows[-1] or round_up(len(items) + 1, rows) * padded > budget
            ):
                break
            longest = max(longest, length)
            done = seq.num_computed + length == seq.prefill_target
            items.append(PrefillItem(seq, seq.num_computed, length, done and not seq.output_ids))
        return items

    def _reserve_decode_blocks(self, seqs: list[Sequence]) -> list[Sequence]:
        """Give each decoding sequence room for its next token, preempting if needed."""
        ready: list[Sequence] = []
        for seq in sorted(seqs, key=_order):
            if seq.status is not Status.RUNNING:
                continue  # preempted while making room for an earlier one
            while len(seq.blocks) * self.pool.block_size <= seq.num_computed:
                try:
                    seq.blocks.append(self.pool.allocate())
                except OutOfBlocksError:
                    victim = max(self.running, key=_order)
                    self._preempt(victim)
                    if victim is seq:
                        break
            if seq.status is Status.RUNNING:
                ready.append(seq)
        return ready

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks, seq.hashes, seq.num_computed = [], [], 0
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def computed(self, seq: Sequence, n_new: int) -> None:
        """Record that ``n_new`` more tokens of ``seq`` are in the cache; register blocks
        that became full with the prefix cache."""
        seq.num_computed += n_new
        bs, ids = self.pool.block_size, seq.all_ids
        while len(seq.hashes) < seq.num_computed // bs:
            i = len(seq.hashes)
            parent = seq.hashes[-1] if seq.hashes else ROOT_HASH
            seq.hashes.append(self.pool.register(seq.blocks[i], parent, ids[i * bs : (i + 1) * bs]))
