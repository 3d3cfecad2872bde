"""A small deterministic stand-in for ``local_tier.jax.Engine`` (same public API), so the
serving layer and the worker's HTTP layer can be tested without loading a model.

Tokens are characters (``ord``); the chat template is ``<role>content\\n`` per message plus
``<assistant>``; every answer spells ``reply`` one character per step (``step_s`` apart),
honouring ``max_tokens``, stop strings and the context limit like the real engine, and
rejecting bad values of vLLM's sampling extensions with the engine's own checks. Prefix
caching is simulated per ``block_size`` so usage and metrics move.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from local_tier.jax.api import (
    EngineOverloadedError,
    EngineRequestError,
    EngineStats,
    GenerationOutput,
    GenerationRequest,
)
from local_tier.jax.sampling import check_extensions


class FakeTokenizer:
    eos_token_ids: tuple[int, ...] = (0,)
    vocab_size = 0x110000  # every code point

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        if messages and messages[-1]["role"] == "assistant" and add_generation_prompt:
            raise ValueError("the last message must not be the assistant's")
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


class FakeEngine:
    """Implements ``EngineProtocol``; records what happened for assertions."""

    def __init__(
        self,
        reply: str = "Hello there, friend.",
        max_model_len: int = 256,
        step_s: float = 0.0,
        max_running: int = 4,
        max_waiting: int = 4,
        block_size: int = 16,
    ) -> None:
        self.tokenizer = FakeTokenizer()
        self.model_name = "fake-model"
        self.max_model_len = max_model_len
        self.reply = reply
        self.step_s = step_s
        self.block_size = block_size
        self.requests: list[GenerationRequest] = []
        self.aborted: list[str] = []
        self.finished: list[str] = []
        self.started = False
        self.stopped = False
        self._slots = asyncio.Semaphore(max_running)
        self._max_waiting = max_waiting
        self._running: set[str] = set()
        self._waiting = 0
        self._blocks: set[tuple[int, ...]] = set()
        self._counts = {"queries": 0, "hits": 0, "prompt": 0, "generated": 0}

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def stats(self) -> EngineStats:
        return EngineStats(
            num_requests_running=len(self._running),
            num_requests_waiting=self._waiting,
            kv_cache_usage_perc=len(self._running) / 10,
            prefix_cache_queries_total=self._counts["queries"],
            prefix_cache_hits_total=self._counts["hits"],
            prompt_tokens_total=self._counts["prompt"],
            generation_tokens_total=self._counts["generated"],
            block_size=self.block_size,
            num_blocks=64,
        )

    def _validate(self, req: GenerationRequest) -> None:
        n = len(req.prompt_token_ids)
        if n >= self.max_model_len:
            raise EngineRequestError("prompt too long", "prompt", "context_length_exceeded")
        if not 0 <= req.params.temperature <= 2:
            raise EngineRequestError("temperature out of range", "temperature")
        check_extensions(req.params, self.tokenizer.vocab_size)  # the engine's own checks
        if self._waiting >= self._max_waiting:
            raise EngineOverloadedError("queue full")

    def _cached(self, ids: list[int]) -> int:
        """Full blocks of ``ids`` seen before (chained: a block counts if all before it do)."""
        self._counts["queries"] += len(ids)
        hits = 0
        for end in range(self.block_size, len(ids) + 1, self.block_size):
            key = tuple(ids[:end])
            if key in self._blocks and hits == end - self.block_size:
                hits = end
            self._blocks.add(key)
        self._counts["hits"] += hits
        return hits

    async def generate(self, req: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        self._validate(req)
        self.requests.append(req)
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        self._running.add(req.request_id)
        try:
            async for out in self._steps(req):
                if out.finish_reason is not None:
                    self.finished.append(req.request_id)
                yield out
        finally:
            self._running.discard(req.request_id)
            self._slots.release()
            if req.request_id not in self.finished:
                self.aborted.append(req.request_id)

    async def _steps(self, req: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        n = len(req.prompt_token_ids)
        cached = self._cached(req.prompt_token_ids)
        self._counts["prompt"] += n
        limit = min(req.params.max_tokens or self.max_model_len, self.max_model_len - n)
        text = ""
        for count, char in enumerate(self.reply[:limit], start=1):
            await asyncio.sleep(self.step_s)
            self._counts["generated"] += 1
            text += char
            stop = next((s for s in req.params.stop if s in text), None)
            if stop is not None:
                cut = text.index(stop)
                delta = char[: max(0, len(char) - (len(text) - cut))]
                yield GenerationOutput(delta, [ord(char)], "stop", n, count, cached)
                return
            reason = "length" if count == limit else None
            yield GenerationOutput(char, [ord(char)], reason, n, count, cached)
            if reason:
                return
        yield GenerationOutput("", [], "stop", n, len(self.reply[:limit]), cached)
