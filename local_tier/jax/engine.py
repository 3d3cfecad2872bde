"""The engine: an asyncio front (``generate``) over a background step loop.

One task runs the loop: take new requests and aborts, plan a step (``scheduler.py``), run it
on the device in a worker thread (``runner.py``), then sample, detokenize and push outputs to
each request's queue. All scheduler state is touched only by that task, between device
steps, so no locks are needed; ``generate`` talks to it through two queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from local_tier.jax import backend  # noqa: F401  (sets XLA_FLAGS before JAX starts)
from local_tier.jax.api import (
    EngineConfig,
    EngineOverloadedError,
    EngineRequestError,
    EngineStats,
    GenerationOutput,
    GenerationRequest,
    ProgressFn,
    SamplingParams,
)
from local_tier.jax.detokenizer import IncrementalDetokenizer, StopFilter
from local_tier.jax.sampling import Sampler, check_params
from local_tier.jax.scheduler import Scheduler, Sequence, StepPlan
from local_tier.jax.setup import Loaded, load_engine_parts, warmup_shapes
from local_tier.jax.tokenizer import Tokenizer


@dataclass(eq=False)
class _Request:
    """Per-request state owned by the step loop."""

    seq: Sequence
    params: SamplingParams
    sampler: Sampler
    detok: IncrementalDetokenizer
    stops: StopFilter
    end_ids: frozenset[int]  # tokens that end the output: EOS (unless ignored), stop_token_ids
    out: asyncio.Queue[GenerationOutput] = field(default_factory=asyncio.Queue)
    pending_ids: list[int] = field(default_factory=list)  # sampled, text still held back
    done: bool = False


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
        self._eos = frozenset(self.tokenizer.eos_token_ids)
        self._progress = progress or (lambda _msg: None)
        self._requests: dict[str, _Request] = {}
        self._incoming: list[_Request] = []
        self._aborts: list[str] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._prompt_tokens = 0
        self._gen_tokens = 0
        self._finished = 0

    @classmethod
    def from_config(cls, config: EngineConfig, progress: ProgressFn | None = None) -> Engine:
        """Load the model, tokenizer and KV cache (no compilation yet: see ``start``)."""
        return cls(config, load_engine_parts(config, progress or (lambda _m: None)), progress)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Compile the common step shapes (persistent cache makes restarts fast), then start
        the step loop. Shapes outside the warm-up set compile on first use."""
        if self._task is not None:
            return
        self._wake = asyncio.Event()
        if self.config.warmup:
            shapes = warmup_shapes(self._runner.buckets, self.config)
            await asyncio.to_thread(self._runner.warmup, shapes)
        self._task = asyncio.create_task(self._loop(), name="jax-engine-loop")

    async def stop(self) -> None:
        """Stop the loop; every unfinished request ends with finish_reason "abort"."""
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
    def _admit(self, req: GenerationRequest) -> _Request:
        if self._task is None:
            raise RuntimeError("engine is not started (await engine.start())")
        max_tokens = self._validate(req)
        if len(self._sched.waiting) + len(self._incoming) >= self.config.max_waiting:
            raise EngineOverloadedError(
                f"{self.config.max_waiting} requests are already waiting; try again later"
            )
        seq = Sequence(
            req.request_id, list(req.prompt_token_ids), max_tokens, priority=req.priority
        )
        state = self._request_state(seq, req.params)
        self._requests[req.request_id] = state
        self._incoming.append(state)
        self._wake.set()
        return state

    def _request_state(self, seq: Sequence, p: SamplingParams) -> _Request:
        """The sampler, detokenizer and stop rules of one request (vLLM's semantics)."""
        stop_ids = frozenset(p.stop_token_ids)
        decode = functools.partial(self.tokenizer.decode, skip_special_tokens=p.skip_special_tokens)
        return _Request(
            seq,
            p,
            # min_tokens holds back EOS even under ignore_eos, as vLLM's all_stop_token_ids.
            Sampler(p, seq.prompt_ids, self._eos | stop_ids),
            IncrementalDetokenizer(decode),
            StopFilter(p.stop, include=p.include_stop_str_in_output),
            stop_ids if p.ignore_eos else self._eos | stop_ids,
        )

    def _validate(self, req: GenerationRequest) -> int:
        """Raise ``EngineRequestError`` for anything that can never run; return max_tokens."""
        p, n = req.params, len(req.prompt_token_ids)
        if req.request_id in self._requests:
            raise EngineRequestError(
                f"request id {req.request_id!r} is already running", "request_id"
            )
        if n == 0:
            raise EngineRequestError("the prompt is empty", "prompt")
        vocab = self.tokenizer.vocab_size
        if any(not 0 <= t < vocab for t in req.prompt_token_ids):
            raise EngineRequestError(f"prompt token ids must be in [0, {vocab})", "prompt")
        check_params(p, vocab)
        limit = min(self.max_model_len, self._sched.pool.num_blocks * self._sched.pool.block_size)
        if n >= limit:
            raise EngineRequestError(
                f"This model's maximum context length is {limit} tokens. However, your prompt "
                f"has {n} tokens, which leaves no room for the completion.",
                "messages",
                code="context_length_exceeded",
            )
        if p.max_tokens is None:
            if p.min_tokens > limit - n:  # vLLM compares with the default max_tokens too
                raise EngineRequestError(
                    f"min_tokens must be <= max_tokens={limit - n}, got {p.min_tokens}",
                    "min_tokens",
                )
            return limit - n
        if n + p.max_tokens > limit:
            raise EngineRequestError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{n + p.max_tokens} tokens ({n} in the prompt, {p.max_tokens} for the "
                f"completion). Please reduce the prompt or max_tokens.",
                "max_tokens",
                code="context_length_exceeded",
            )
        return p.max_tokens

    # ------------------------------------------------------------------ the loop
    async def _loop(self) -> None:
        while True:
            self._take_incoming()
            plan = self._sched.schedule()
            if plan is None:
                self._wake.clear()
                if not (self._incoming or self._aborts):
                    await self._wake.wait()
                continue
            batch = self._runner.prepare(plan)
            greedy = all(self._rows_greedy(plan))
            ids, logits = await asyncio.to_thread(self._runner.execute, batch, not greedy)
            self._apply(plan, ids, logits)
            await asyncio.sleep(0)  # let consumers and new requests in between steps

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

    def _rows_greedy(self, plan: StepPlan) -> list[bool]:
        """Per sampled row: whether the device's argmax is its token (greedy, and nothing
        changes its logits this step), so the step may skip copying logits to the host."""
        seqs = plan.decode if plan.kind == "decode" else [i.seq for i in plan.prefill if i.sample]
        return [
            self._requests[s.request_id].sampler.device_argmax_exact(len(s.output_ids))
            for s in seqs
        ]

    def _apply(self, plan: StepPlan, ids: Any, logits: Any) -> None:
        if plan.kind == "decode":
            for row, seq in enumerate(plan.decode):
                self._sched.computed(seq, 1)
                self._sampled(seq, row, ids, logits)
            return
        for row, item in enumerate(plan.prefill):
            self._sched.computed(item.seq, item.length)
            if item.sample:
                self._sampled(item.seq, row, ids, logits)

    def _sampled(self, seq: Sequence, row: int, ids: Any, logits: Any) -> None:
        req = self._requests.get(seq.request_id)
        if req is None or req.done:
            return
        sampler = req.sampler
        if sampler.device_argmax_exact(len(seq.output_ids)):
            token = int(ids[row])
        else:
            token = sampler.sample(logits[row], seq.output_ids)
        seq.output_ids.append(token)
        self._gen_tokens += 1
        self._emit(req, token)

    def _emit(self, req: _Request, token: int) -> None:
        """Detokenize ``token`` and decide whether the output ends (vLLM's rules: an end
        token's text is left out unless include_stop_str_in_output; stop strings are searched
        only in the text of tokens after the first min_tokens)."""
        seq, p, reason = req.seq, req.params, None
        check = len(seq.output_ids) > p.min_tokens
        if token in req.end_ids:  # min_tokens masked these while it mattered
            reason = "stop"
            text = (
                req.stops.push(req.detok.push([token]), check)
                if p.include_stop_str_in_output
                else ""
            )
            text += req.stops.push(req.detok.flush(), check)
        else:
            text = req.stops.push(req.detok.push([token]), check)
            if req.stops.stopped:
                reason = "stop"
            elif len(seq.output_ids) >= seq.max_tokens:
                reason, text = "length", text + req.stops.push(req.detok.flush(), check)
        if reason is not None:
            text += req.stops.flush()
            self._finish(req, reason, text, [token])
        elif text:
            req.out.put_nowait(self._output(req, text, [token], None))
        else:
            req.pending_ids.append(token)

    def _output(
        self, req: _Request, text: str, ids: list[int], reason: str | None
    ) -> GenerationOutput:
        held, req.pending_ids = req.pending_ids, []
        seq = req.seq
        return GenerationOutput(
            text=text,
            token_ids=held + ids,
            finish_reason=reason,
            prompt_tokens=len(seq.prompt_ids),
            completion_tokens=len(seq.output_ids),
            cached_tokens=seq.num_cached,
            scheduled_at=seq.first_scheduled,
        )

    def _finish(
        self, req: _Request, reason: str, text: str = "", ids: list[int] | None = None
    ) -> None:
        if req.done:
            return
        req.done = True
        self._sched.finish(req.seq)
        self._requests.pop(req.seq.request_id, None)
        self._finished += 1
        req.out.put_nowait(self._output(req, text, ids or [], reason))
