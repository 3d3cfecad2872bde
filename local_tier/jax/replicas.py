"""Data parallelism: ``data_parallel`` independent engines behind one engine front.

Each replica is a whole ``Engine`` (its own weights, KV cache, scheduler and step loop) on
its own group of ``tensor_parallel`` devices (``setup.device_placement``). ``Replicas``
implements ``EngineProtocol`` over them: a request goes to the replica with the fewest
requests in flight (running + waiting; ties: the lowest index), and ``stats()`` adds the
replicas' counters up. A replica's prefix cache serves only the requests sent to it: routing
by load, not by prefix, so a repeated prompt may miss on another replica.

``build_engine(config)`` is the entry point that honours ``data_parallel`` (the provider and
the worker use it); ``Engine.from_config`` builds a single replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import cast

from local_tier.jax.api import (
    EngineConfig,
    EngineProtocol,
    EngineRequestError,
    EngineStats,
    GenerationOutput,
    GenerationRequest,
    ProgressFn,
    TokenizerProtocol,
)


class Replicas:
    """Several engines serving one model as one (``EngineProtocol``)."""

    def __init__(self, engines: Sequence[EngineProtocol]) -> None:
        if not engines:
            raise ValueError("Replicas needs at least one engine")
        self.engines = list(engines)
        first = self.engines[0]
        self.tokenizer: TokenizerProtocol = first.tokenizer
        self.model_name = first.model_name
        self.max_model_len = min(e.max_model_len for e in self.engines)
        self.in_flight = [0] * len(self.engines)  # requests handed to each, not yet finished
        self._ids: set[str] = set()

    async def start(self) -> None:
        """Start (compile) every replica; they compile concurrently."""
        await asyncio.gather(*(e.start() for e in self.engines))

    async def stop(self) -> None:
        await asyncio.gather(*(e.stop() for e in self.engines))

    def pick(self) -> int:
        """The replica with the fewest requests in flight (ties: the lowest index)."""
        return min(range(len(self.engines)), key=self.in_flight.__getitem__)

    async def generate(self, req: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        """As ``Engine.generate``, on the least busy replica."""
        if req.request_id in self._ids:
            raise EngineRequestError(
                f"request id {req.request_id!r} is already running", "request_id"
            )
        index = self.pick()
        self.in_flight[index] += 1
        self._ids.add(req.request_id)
        outputs = self.engines[index].generate(req)
        try:
            async for out in outputs:
                yield out
        finally:
            # Closing this front closes the replica's stream now (not at garbage collection),
            # so the replica aborts the sequence and frees its KV blocks at once.
            await aclose(outputs)
            self.in_flight[index] -= 1
            self._ids.discard(req.request_id)

    def stats(self) -> EngineStats:
        return merge_stats([e.stats() for e in self.engines])


async def aclose(outputs: AsyncIterator[GenerationOutput]) -> None:
    close = getattr(outputs, "aclose", None)  # async generators have it; any iterator may not
    if close is not None:
        await close()


def merge_stats(parts: Sequence[EngineStats]) -> EngineStats:
    """The replicas' stats as one engine's: counters and blocks add up, cache usage is the
    share of all blocks in use."""
    blocks = sum(s.num_blocks for s in parts)
    used = sum(s.kv_cache_usage_perc * s.num_blocks for s in parts)
    return EngineStats(
        num_requests_running=sum(s.num_requests_running for s in parts),
        num_requests_waiting=sum(s.num_requests_waiting for s in parts),
        kv_cache_usage_perc=used / blocks if blocks else 0.0,
        prefix_cache_queries_total=sum(s.prefix_cache_queries_total for s in parts),
        prefix_cache_hits_total=sum(s.prefix_cache_hits_total for s in parts),
        prompt_tokens_total=sum(s.prompt_tokens_total for s in parts),
        generation_tokens_total=sum(s.generation_tokens_total for s in parts),
        block_size=parts[0].block_size,
        num_blocks=blocks,
        num_preemptions_total=sum(s.num_preemptions_total for s in parts),
        requests_finished_total=sum(s.requests_finished_total for s in parts),
    )


def build_engine(config: EngineConfig, progress: ProgressFn | None = None) -> EngineProtocol:
    """The engine ``config`` describes: one ``Engine``, or ``Replicas`` of
    ``data_parallel`` engines (each loads the model onto its own devices)."""
    from local_tier.jax.engine import Engine  # imports JAX
    from local_tier.jax.setup import load_engine_parts

    report = progress or (lambda _m: None)
    if config.data_parallel == 1:
        return cast(EngineProtocol, Engine.from_config(config, progress))
    engines = []
    for replica in range(config.data_parallel):
        report(f"data-parallel replica {replica + 1} of {config.data_parallel}")
        parts = load_engine_parts(config, report, replica)
        engines.append(cast(EngineProtocol, Engine(config, parts, progress)))
    return Replicas(engines)


__all__ = ["Replicas", "build_engine", "merge_stats"]
