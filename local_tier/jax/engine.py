"""The engine: an asyncio front (``generate``) over a background step loop.

One task runs the loop: take new requests and aborts, plan a step (``scheduler.py``), run it
on the device in a worker thread (``runner.py``), then sample, detokenize and push outputs to
each request's queue (``requests.py``). All scheduler state is touched only by that task,
between device steps, so no locks are needed; ``generate`` talks to it through two queues.
While the same batch keeps decoding, the loop works one step behind the device: the next
step is dispatched, fed with the device's tokens, before this step's tokens are read
(``_advance``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from local_tier.jax import backend  # noqa: F401  (sets XLA_FLAGS before JAX starts)
from local_tier.jax.api import (
    EngineConfig,
    EngineOverloadedError,
    EngineRequestError,
    EngineStats,
    GenerationOutput,
    GenerationRequest,
    ProgressFn,
)
from local_tier.jax.compile_plan import BackgroundCompiler, CompilePlan, PlanSpace
from local_tier.jax.device_sampling import RowState
from local_tier.jax.requests import RequestState, validate
from local_tier.jax.runner import Batch, Pending
from local_tier.jax.scheduler import Scheduler, Sequence, StepPlan
from local_tier.jax.setup import Loaded, load_engine_parts
from local_tier.jax.tokenizer import Tokenizer

_T = TypeVar("_T")
PLACEHOLDER = -1  # an output token still on the device (see ``Engine._mark``)


@dataclass
class LoopTiming:
    """Where the step loop's time goes (cumulative; the benchmarks read differences)."""

    steps: int = 0  # steps dispatched
    chained: int = 0  # ... of them dispatched before the previous step's tokens were read
    busy_s: float = 0.0  # loop time with work to do (idle waits for requests excluded)
    device_wait_s: float = 0.0  # ... of it spent waiting on device work (worker thread)

    @property
    def host_s(self) -> float:
        """Host work on the loop's critical path: planning, inputs, sampling, outputs."""
        return self.busy_s - self.device_wait_s


@dataclass
class _InFlight:
    plan: StepPlan
    pending: Pending


class Engine:
    """Continuous-batching text generation on one JAX device (see ``api.py``)."""

    def __init__(self, config: EngineConfig, parts: Loaded, progress: ProgressFn | None = None):
        self.config = config
        self.tokenizer: Tokenizer = parts.tokenizer
        self.model_name = parts.model_name
        self.max_model_len = parts.max_model_len
        self.device = parts.runner.device
        self._runner = parts.runner
        self._sched: Scheduler = parts.scheduler
        self._progress = progress or (lambda _msg: None)
        self._requests: dict[str, RequestState] = {}
        self._incoming: list[RequestState] = []
        self._aborts: list[str] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._prompt_tokens = 0
        self._gen_tokens = 0
        self._finished = 0
        self.timing = LoopTiming()
        self._rng = np.random.default_rng()  # sampling keys of requests without a seed

    @classmethod
    def from_config(cls, config: EngineConfig, progress: ProgressFn | None = None) -> Engine:
        """Load the model, tokenizer and KV cache (no compilation yet: see ``start``). One
        engine: ``data_parallel`` above 1 is ``replicas.build_engine``'s job."""
        if config.data_parallel != 1:
            raise ValueError(
                "Engine.from_config builds one engine; use local_tier.jax.replicas.build_engine "
                f"for data_parallel={config.data_parallel}"
            )
        return cls(config, load_engine_parts(config, progress or (lambda _m: None)), progress)

    # ------------------------------------------------------------------ lifecycle
    _compiler: BackgroundCompiler | None = None  # compiles the rest after ``start``

    async def start(self) -> None:
        """Compile the few step shapes that contain every plan the scheduler can make
        (``compile_plan.py``; the persistent cache makes restarts fast), start the step loop,
        then compile every other bucket shape in a background thread (each serves from the
        step after it is ready). So no step compiles while serving. Without ``warmup``,
        shapes compile on first use."""
        if self._task is not None:
            return
        self._wake = asyncio.Event()
        if self.config.warmup:
            plan = CompilePlan.build(PlanSpace.of(self._sched, self.max_model_len))
            t0 = time.perf_counter()
            await asyncio.to_thread(self._runner.warmup, list(plan.ready))
            self._progress(
                f"compiled the {len(plan.ready)} step shapes that cover every plan in "
                f"{time.perf_counter() - t0:.1f}s; {len(plan.background)} more compile in the "
                "background"
            )
            self._compiler = BackgroundCompiler(
                self._runner.compile_shape, plan.background, self._progress, self._busy
            )
            self._runner.want_compiled = self._compiler.prefer
        self._task = asyncio.create_task(self._loop(), name="jax-engine-loop")
        if self._compiler is not None:
            self._compiler.start()

    def _busy(self) -> bool:
        """Whether requests are in the engine (read from the compile thread: a stale answer
        only moves a background compile by a moment)."""
        return bool(self._incoming) or self._sched.has_work()

    async def stop(self) -> None:
        """Stop the loop; every unfinished request ends with finish_reason "abort"."""
        compiler, self._compiler = self._compiler, None
        if compiler is not None:  # ends after the compile in progress
            await asyncio.to_thread(compiler.stop)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for req in list(self._requests.values()) + self._incoming:
            self._finish(req, "abort")
        self._incoming.clear()

    # ------------------------------------------------------------------ public API
    async def generate(self, req: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        """Stream outputs for ``req``; see ``api.py`` for the contract."""
        state = self._admit(req)
        try:
            while True:
                out = await state.out.get()
                yield out
                if out.finish_reason is not None:
                    return
        finally:
            if not state.done:
                self._aborts.append(req.request_id)
                self._wake.set()

    @property
    def decode_weight_bytes(self) -> int:
        """Bytes of weights one decode step reads (the memory-bandwidth cost of a token)."""
        return self._runner.decode_weight_bytes

    def stats(self) -> EngineStats:
        pool, s = self._sched.pool, self._sched
        return EngineStats(
            num_requests_running=len(s.running),
            num_requests_waiting=len(s.waiting) + len(self._incoming),
            kv_cache_usage_perc=pool.usage(),
            prefix_cache_queries_total=s.prefix_queries,
            prefix_cache_hits_total=s.prefix_hits,
            prompt_tokens_total=self._prompt_tokens,
            generation_tokens_total=self._gen_tokens,
            block_size=pool.block_size,
            num_blocks=pool.num_blocks,
            num_preemptions_total=s.num_preemptions,
            requests_finished_total=self._finished,
        )

    # ------------------------------------------------------------------ admission
    def _admit(self, req: GenerationRequest) -> RequestState:
        if self._task is None or self._task.done():
            raise RuntimeError("engine is not running (await engine.start())")
        max_tokens = self._validate(req)
        if len(self._sched.waiting) + len(self._incoming) >= self.config.max_waiting:
            raise EngineOverloadedError(
                f"{self.config.max_waiting} requests are already waiting; try again later"
            )
        seq = Sequence(
            req.request_id, list(req.prompt_token_ids), max_tokens, priority=req.priority
        )
        state = RequestState.new(seq, req.params, self.tokenizer, self._rng)
        self._requests[req.request_id] = state
        self._incoming.append(state)
        self._wake.set()
        return state

    def _validate(self, req: GenerationRequest) -> int:
        """Raise ``EngineRequestError`` for anything that can never run; return max_tokens."""
        if req.request_id in self._requests:
            raise EngineRequestError(
                f"request id {req.request_id!r} is already running", "request_id"
            )
        pool = self._sched.pool
        limit = min(self.max_model_len, pool.num_blocks * pool.block_size)
        return validate(
            req, self.tokenizer.vocab_size, limit, frozenset(self.tokenizer.eos_token_ids)
        )

    # ------------------------------------------------------------------ the loop
    async def _loop(self) -> None:
        try:
            await self._steps()
        except Exception as exc:  # a defect or a device failure: nobody may wait forever
            self._progress(f"engine loop failed: {exc!r}")
            for req in list(self._requests.values()) + self._incoming:
                self._finish(req, "abort")
            self._incoming.clear()

    async def _steps(self) -> None:
        inflight: _InFlight | None = None  # a decode step dispatched, its tokens not read
        while True:
            started = time.perf_counter()
            if inflight is not None:
                inflight = await self._advance(inflight)
            else:
                self._take_incoming()
                plan = self._sched.schedule()
                if plan is None:
                    self._wake.clear()
                    if not (self._incoming or self._aborts):
                        await self._wake.wait()
                    continue
                inflight = await self._run(plan)
            self.timing.busy_s += time.perf_counter() - started
            await asyncio.sleep(0)  # let consumers and new requests in between steps

    async def _run(self, plan: StepPlan) -> _InFlight | None:
        """Run a planned step: a decode step is only dispatched (returned in flight, see
        ``_advance``) unless ``pipeline_decode`` is off; a prefill step runs to its end."""
        batch = self._runner.prepare(plan)
        self._runner.sampling_arrays(batch, self._row_states(plan))
        if plan.kind == "decode" and self.config.pipeline_decode:
            pending = await self._device(self._runner.dispatch, batch, False)
            self._mark(plan)
            return _InFlight(plan, pending)
        ids, _ = await self._device(self._runner.execute, batch, False)
        self._mark(plan)
        self._fill(plan, ids)
        return None

    def _row_states(self, plan: StepPlan) -> list[RowState | None]:
        """Each row's sampling state (None: a prefill chunk whose token is not used)."""
        if plan.kind == "decode":
            return [self._requests[s.request_id].row_state() for s in plan.decode]
        return [
            self._requests[i.seq.request_id].row_state() if i.sample else None for i in plan.prefill
        ]

    async def _device(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` in a worker thread (device work), its wall time counted as waiting."""
        started = time.perf_counter()
        try:
            return await asyncio.to_thread(fn, *args)
        finally:
            self.timing.device_wait_s += time.perf_counter() - started

    async def _advance(self, inflight: _InFlight) -> _InFlight | None:
        """Read the in-flight decode step. When the same batch decodes next and nothing waits
        (``Scheduler.repeat_decode``), that step is dispatched first, fed with the in-flight
        step's device tokens, so the device computes while the host reads, detokenizes and
        checks stops; a sequence that ends on a token read here has wasted one row of the
        step already running (its blocks are freed; the device runs steps in order, so the
        stray write lands before any later owner of the block writes it)."""
        nxt = None if self._incoming or self._aborts else self._repeat(inflight.plan)
        if nxt is None:
            ids, _ = await self._device(self._runner.collect, inflight.pending)
            self._fill(inflight.plan, ids)
            return None
        batch = self._runner.prepare(nxt)
        pending, (ids, _) = await self._device(self._dispatch_then_collect, batch, inflight.pending)
        self.timing.chained += 1
        self._fill(inflight.plan, ids)
        self._mark(nxt)
        return _InFlight(nxt, pending)

    def _repeat(self, plan: StepPlan) -> StepPlan | None:
        """The chained next decode step, or None (see ``_advance``). The chain ends when a
        sequence has ended, or when the token in flight is a sequence's last
        (``max_tokens``)."""
        seqs = plan.decode
        if any(s.request_id not in self._requests for s in seqs):
            return None  # ended on the token read last (its row in flight is wasted)
        if any(len(s.output_ids) >= s.max_tokens for s in seqs):
            return None
        return self._sched.repeat_decode(seqs)

    def _dispatch_then_collect(self, batch: Batch, feed: Pending) -> tuple[Pending, Any]:
        pending = self._runner.dispatch(batch, False, feed=feed)
        return pending, self._runner.collect(feed)

    def _mark(self, plan: StepPlan) -> None:
        """The step is on the device: its tokens' K/V count as computed, and each sampled row
        holds a placeholder for the token the step produces (so the next plan sees the right
        lengths) until ``_fill`` reads it."""
        if plan.kind == "decode":
            work = [(s, 1, True) for s in plan.decode]
        else:
            work = [(i.seq, i.length, i.sample) for i in plan.prefill]
        self.timing.steps += 1
        for seq, n_new, sample in work:
            req = self._requests.get(seq.request_id)
            if req is None or req.done:
                continue
            self._sched.computed(seq, n_new)
            if sample:
                seq.output_ids.append(PLACEHOLDER)

    def _fill(self, plan: StepPlan, ids: Any) -> None:
        """Replace each sampled row's placeholder with its token and emit it."""
        if plan.kind == "decode":
            rows = list(enumerate(plan.decode))
        else:
            rows = [(r, i.seq) for r, i in enumerate(plan.prefill) if i.sample]
        for row, seq in rows:
            req = self._requests.get(seq.request_id)
            if req is None or req.done:
                continue
            seq.output_ids[-1] = token = int(ids[row])  # was the placeholder
            self._gen_tokens += 1
            self._emit(req, token)

    def _take_incoming(self) -> None:
        for rid in self._aborts:
            req = self._requests.get(rid)
            if req is not None:
                self._finish(req, "abort")
        self._aborts.clear()
        for req in self._incoming:
            if not req.done:
                self._sched.add(req.seq)
                self._prompt_tokens += len(req.seq.prompt_ids)
        self._incoming.clear()

    def _emit(self, req: RequestState, token: int) -> None:
        reason, text = req.push(token)
        if reason is not None:
            self._finish(req, reason, text, [token])
        elif text:
            req.out.put_nowait(req.output(text, [token], None))
        else:
            req.pending_ids.append(token)

    def _finish(
        self, req: RequestState, reason: str, text: str = "", ids: list[int] | None = None
    ) -> None:
        if req.done:
            return
        req.done = True
        self._sched.finish(req.seq)
        self._requests.pop(req.seq.request_id, None)
        self._finished += 1
        req.out.put_nowait(req.output(text, ids or [], reason))
