"""Which step shapes to compile, when, and which compiled shape serves a plan.

A step shape is ``(rows, new tokens, context)`` after padding to the buckets (``buckets.py``);
the context is the block table's width, the same for every step (attention reads only the
chunks the rows fill), so shapes differ in rows and new tokens only. Every distinct shape is
one XLA compile (1-4 s on a small CPU), and a shape first met while serving stalls every
stream for that long. So the engine compiles ahead of time:

- ``possible_shapes``: every shape the scheduler's rules can produce (decode: up to
  ``max_rows`` sequences; prefill: up to the largest row bucket of items, chunks up to the
  budget, ``rows x chunk <= budget`` when more than one row). 19 at the worker's defaults.
- ``ready_set``: every decode shape (decode is what every stream does on every step; a row
  of padding costs ~3 ms on a 2-core CPU) plus a cover of the prefill shapes with bounded
  padding: no prefill plan runs padded to a shape costing more than ``READY_SLACK`` times
  its own. The engine compiles it before it reports ready (13 shapes at the defaults).
  Padding up is always correct (padding rows and tokens write the scratch block 0 and are
  masked).
- ``background_order``: the rest, compiled after start, the shapes serving the most plans
  first.
- ``serving_shape``: the cheapest compiled shape that contains a plan's padded shape.

``BackgroundCompiler`` runs the background compiles in a thread; the runner compiles ahead of
time on abstract inputs (``Runner.compile_shape``), so that thread never touches the live
KV cache.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from local_tier.jax.buckets import Buckets, round_up
from local_tier.jax.scheduler import PrefillItem, Scheduler, Sequence

Shape = tuple[int, int, int]  # (rows, new tokens per row, context tokens)


@dataclass(frozen=True)
class PlanSpace:
    """The scheduler's limits that decide which shapes its plans can have.

    ``max_rows``: sequences running at once (``max_batch_size``); ``prefill_budget``: the
    largest prefill budget (``prefill_chunk_tokens``; the background budget is smaller, so its
    shapes are a subset); ``limit``: the most tokens one sequence can hold
    (``min(max_model_len, KV cache tokens)``)."""

    buckets: Buckets
    max_rows: int
    prefill_budget: int
    limit: int

    @classmethod
    def of(cls, sched: Scheduler, max_model_len: int) -> PlanSpace:
        """The space of ``sched``'s plans for sequences of up to ``max_model_len`` tokens."""
        pool = sched.pool
        limit = min(max_model_len, pool.num_blocks * pool.block_size)
        return cls(sched.buckets, sched.max_running, sched.prefill_budget, limit)


def decode_need(buckets: Buckets, seqs: list[Sequence]) -> Shape:
    """The bucket shape of a decode step over ``seqs``."""
    return round_up(len(seqs), buckets.decode_batch), 1, buckets.context


def prefill_need(buckets: Buckets, items: list[PrefillItem]) -> Shape:
    """The bucket shape of a prefill step over ``items``."""
    rows = round_up(len(items), buckets.prefill_rows)
    return rows, round_up(max(i.length for i in items), buckets.prefill_len), buckets.context


def reachable(buckets: tuple[int, ...], lo: int, hi: int) -> list[int]:
    """``sorted({round_up(v, buckets) for v in range(lo, hi + 1)})`` without the loop: the
    buckets that some value in ``[lo, hi]`` pads to. ValueError if ``hi`` exceeds them."""
    if hi < lo:
        return []
    if hi > buckets[-1]:
        raise ValueError(f"{hi} exceeds the largest bucket {buckets[-1]}")
    out, prev = [], None
    for b in buckets:
        if b >= lo and (prev is None or prev < hi):
            out.append(b)
        prev = b
    return out


def possible_shapes(space: PlanSpace) -> list[Shape]:
    """Every padded shape a decode or prefill plan of the scheduler can need (sorted)."""
    bk = space.buckets
    decode = [(b, 1, bk.context) for b in reachable(bk.decode_batch, 1, space.max_rows)]
    items = min(bk.prefill_rows[-1], space.max_rows)
    longest = min(space.prefill_budget, space.limit - 1)
    prefill = [
        (r, t, bk.context)
        for r in reachable(bk.prefill_rows, 1, items)
        for t in reachable(bk.prefill_len, 1, longest)
        if r == bk.prefill_rows[0] or r * t <= space.prefill_budget
    ]
    return sorted(set(decode + prefill))


def _family(shape: Shape) -> bool:
    """Decode steps (one new token) run on the decode weights, the others on the prefill
    weights, which may differ in dtype: a shape serves only its own family."""
    return shape[1] == 1


def contains(big: Shape, small: Shape) -> bool:
    """Whether a step compiled for ``big`` can run a plan padded to ``small``."""
    return _family(big) == _family(small) and all(x >= y for x, y in zip(big, small, strict=True))


def cover(shapes: Iterable[Shape]) -> list[Shape]:
    """The shapes of ``shapes`` that no other one contains: the smallest subset such that
    every shape is contained in one of it (sorted)."""
    pool = sorted(set(shapes))
    return [s for s in pool if not any(o != s and contains(o, s) for o in pool)]


# A step's relative cost (XLA:CPU, SmolLM2, docs/local_tier_jax.md): reading the weights
# (~50 ms a step on 2 cores) against a new token's matmuls (0.4-0.8 ms); the context is read
# as far as the rows fill it whatever the shape, so it is not part of a shape's cost.
STEP_BASE_COST = 6000
NEW_TOKEN_COST = 200
# ``ready_set``: every plan runs in a shape at most this many times its own step's cost.
READY_SLACK = 2.0


def step_cost(shape: Shape) -> int:
    """A rough relative cost of one step of ``shape``: a fixed part (the weights) plus the
    new tokens (see the constants above)."""
    b, t, _ = shape
    return STEP_BASE_COST + b * t * NEW_TOKEN_COST


def ready_set(shapes: Iterable[Shape], slack: float = READY_SLACK) -> list[Shape]:
    """A cover of ``shapes`` with bounded padding: every shape is contained in a chosen one
    whose ``step_cost`` is at most ``slack`` times its own. Greedy, from the costliest shape
    down: one not yet served within the bound adds, of the shapes that serve it within the
    bound, the one serving the most shapes still unserved. Every shape of ``cover`` is in it
    (nothing else contains one)."""
    pool = sorted(set(shapes), key=lambda s: (-step_cost(s), s))

    def serves(c: Shape, u: Shape) -> bool:
        return contains(c, u) and step_cost(c) <= slack * step_cost(u)

    left, chosen = set(pool), []
    for u in pool:
        if u not in left:
            continue
        best = max(
            (s for s in pool if serves(s, u)),
            key=lambda s: (sum(serves(s, v) for v in left), -step_cost(s), s),
        )
        chosen.append(best)
        left = {v for v in left if not serves(best, v)}
    return sorted(chosen)


def serving_shape(need: Shape, compiled: Iterable[Shape]) -> Shape | None:
    """The cheapest shape of ``compiled`` that contains ``need`` (``need`` itself if
    compiled), or None when none does."""
    fits = [c for c in compiled if contains(c, need)]
    return min(fits, key=lambda c: (step_cost(c), c)) if fits else None


def background_order(shapes: Iterable[Shape], done: Iterable[Shape]) -> list[Shape]:
    """``shapes`` not in ``done``, the larger first: each serves more plans, so it shrinks the
    padding of the most plans meanwhile."""
    skip = set(done)
    rest = [s for s in set(shapes) if s not in skip]
    return sorted(rest, key=lambda s: (-s[0] * s[1], s))


@dataclass(frozen=True)
class CompilePlan:
    """What ``Engine.start`` compiles before reporting ready (``ready``) and after
    (``background``, in order)."""

    shapes: tuple[Shape, ...]
    ready: tuple[Shape, ...]
    background: tuple[Shape, ...]

    @classmethod
    def build(cls, space: PlanSpace, slack: float = READY_SLACK) -> CompilePlan:
        """``ready``: every decode shape and ``ready_set(prefill shapes, slack)``;
        ``background``: the rest, in order."""
        shapes = possible_shapes(space)
        decode = [s for s in shapes if _family(s)]
        first = sorted(decode + ready_set([s for s in shapes if not _family(s)], slack))
        return cls(tuple(shapes), tuple(first), tuple(background_order(shapes, first)))


class BackgroundCompiler:
    """Compiles ``shapes`` one by one in a daemon thread with ``compile_one`` (which must not
    touch state another thread mutates); ``stop`` ends it after the compile in progress.

    A compile takes seconds of CPU (XLA's own threads included), which on a small CPU
    slows the steps being served, while every plan already has a compiled shape within
    ``READY_SLACK`` of its cost. So while ``busy()`` says requests are in the engine, a
    compile waits, up to ``max_defer_s`` (then it runs anyway, so a server never idle
    still gets its exact shapes). The thread also lowers its own CPU priority where the OS
    allows (Linux: per thread).

    ``prefer(shape)``: a plan is running padded to a costlier shape than its own right now
    (``Runner.want_compiled``); that shape jumps the queue (under steady load the queue
    alone would reach it after many minutes). It still waits like the others: compiling at
    once, on two cores under load, cost more than serving padded (``bench/cold_start.py``:
    12 completions in 30 s and TTFT p50 3.9 s, against 21 and 1.6 s)."""

    def __init__(
        self,
        compile_one: Callable[[Shape], object],
        shapes: Iterable[Shape],
        report: Callable[[str], None],
        busy: Callable[[], bool] = lambda: False,
        max_defer_s: float = 30.0,
    ) -> None:
        self._compile_one = compile_one
        self._shapes = list(shapes)
        self._report = report
        self._busy = busy
        self._max_defer_s = max_defer_s
        self._stop = threading.Event()
        self._preferred: collections.deque[Shape] = collections.deque()  # thread-safe ends
        self._thread = threading.Thread(target=self._run, name="jax-compile", daemon=True)
        self.done = 0
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def prefer(self, shape: Shape) -> None:
        """Compile ``shape`` next (any thread may call it; unknown shapes are ignored)."""
        self._preferred.append(shape)

    def _next(self, left: list[Shape]) -> tuple[Shape, bool] | None:
        """The next shape to compile and whether it was preferred; None when all are done."""
        while self._preferred:
            shape = self._preferred.popleft()
            if shape in left:
                left.remove(shape)
                return shape, True
        return (left.pop(0), False) if left else None

    def stop(self, timeout: float | None = None) -> None:
        """Ask the thread to end and wait for it (at most ``timeout`` seconds)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        t0 = time.perf_counter()
        left = list(self._shapes)
        while (picked := self._next(left)) is not None:
            shape, preferred = picked
            deadline = time.monotonic() + self._max_defer_s
            while self._busy() and time.monotonic() < deadline and not self._stop.is_set():
                if self._preferred and not preferred:
                    break
                self._stop.wait(0.2)
            if self._preferred and not preferred:  # a wanted shape came up meanwhile
                left.insert(0, shape)
                continue
            if self._stop.is_set():
                return
            try:
                self._compile_one(shape)
            except Exception as exc:  # a failed compile must not kill serving: report it
                self.error = exc
                self._report(f"background compile of {shape} failed: {exc!r}")
                return
            self.done += 1
        self._report(
            f"background compiles done: {self.done} step shapes in "
            f"{time.perf_counter() - t0:.1f}s (every bucket shape is now compiled)"
        )
