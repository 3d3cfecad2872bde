"""Which replica likely holds which prompt-prefix blocks: the router-side, approximate index.

llm-d's "approximate prefix cache" idea: the gateway cannot ask a worker what is in its KV
cache, but it knows where it sent each prompt. After routing a request to a replica,
``record(replica, hashes)`` remembers the request's chained block hashes (``routers.prefix``)
there; ``matched(replica, hashes)`` says how many leading blocks of a new prompt that replica
has seen. Contract:

- Per replica, at most ``capacity`` hashes are kept, evicting the least recently recorded
  first. The capacity mirrors the replica's KV pool (``set_capacity_tokens`` from
  ``vllm:cache_config_info``: num_gpu_blocks * block_size tokens), since the worker cannot hold
  more than that either; until it is known, ``capacity_blocks_per_replica`` applies.
- Within one ``record`` the deepest blocks are the least recent, so eviction trims a prompt
  from its tail, as vLLM frees the tail blocks of a finished request first; leading blocks,
  shared by many prompts, stay longest.
- ``matched`` counts leading hashes only (a chained hash missing in the middle ends the
  match) and does not refresh recency: scoring every replica must not change the index.
- Entries older than ``ttl_s`` (when set) no longer match: a worker under other traffic may
  have evicted them. ``forget(replica)`` drops a replica (restarted, removed).

It is a guess by design: it can say "cached" for blocks the worker evicted under pressure
from other clients, and it never knows about requests other gateway replicas sent.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from core.clock import Clock
from core.routing import PREFIX_BLOCK_CHARS

CHARS_PER_TOKEN = 4.0  # the estimate routing uses elsewhere (RouteRequest.prompt_tokens)


def whole_kv_blocks(router_blocks: int, kv_block_tokens: int) -> int:
    """``router_blocks`` matched routing blocks (``PREFIX_BLOCK_CHARS`` characters each)
    rounded down to whole KV blocks of ``kv_block_tokens``: a worker reuses only full blocks
    (the CPU vLLM's are 128 tokens, so a shared 100-token prefix earns nothing there)."""
    per_kv_block = max(1, round(kv_block_tokens * CHARS_PER_TOKEN / PREFIX_BLOCK_CHARS))
    return router_blocks // per_kv_block * per_kv_block


class PrefixIndex:
    """Per-replica LRU sets of chained block hashes. Not thread-safe (one event loop)."""

    def __init__(
        self,
        capacity_blocks_per_replica: int,
        clock: Clock,
        *,
        block_chars: int = 64,
        ttl_s: float | None = None,
    ) -> None:
        if capacity_blocks_per_replica < 1:
            raise ValueError("capacity_blocks_per_replica must be >= 1")
        self.default_capacity = capacity_blocks_per_replica
        self.block_chars = block_chars  # must equal the block_chars the hashes were made with
        self.ttl_s = ttl_s
        self._clock = clock
        self._blocks: dict[str, OrderedDict[int, float]] = {}  # hash -> recorded at
        self._capacity: dict[str, int] = {}

    def capacity(self, replica: str) -> int:
        """The most hashes kept for ``replica``."""
        return self._capacity.get(replica, self.default_capacity)

    def set_capacity(self, replica: str, blocks: int) -> None:
        """Bound ``replica`` to ``blocks`` hashes (at least 1), evicting the oldest now."""
        self._capacity[replica] = max(1, blocks)
        self._evict(replica)

    def set_capacity_tokens(
        self, replica: str, tokens: int, chars_per_token: float = CHARS_PER_TOKEN
    ) -> None:
        """Bound ``replica`` by its KV pool in tokens, converted to this index's char blocks."""
        self.set_capacity(replica, int(tokens * chars_per_token) // self.block_chars)

    def record(self, replica: str, hashes: Sequence[int]) -> None:
        """Remember that ``replica`` was sent a prompt with these leading block hashes."""
        if not hashes:
            return
        blocks = self._blocks.setdefault(replica, OrderedDict())
        now = self._clock.now()
        # Deepest first, so the leading (most shared) blocks end up most recent.
        for value in reversed(hashes):
            blocks[value] = now
            blocks.move_to_end(value)
        self._evict(replica)

    def matched(self, replica: str, hashes: Sequence[int]) -> int:
        """How many leading ``hashes`` ``replica`` likely holds (0 when none or unknown)."""
        blocks = self._blocks.get(replica)
        if not blocks:
            return 0
        oldest = -float("inf") if self.ttl_s is None else self._clock.now() - self.ttl_s
        count = 0
        for value in hashes:
            seen = blocks.get(value)
            if seen is None or seen < oldest:
                break
            count += 1
        return count

    def forget(self, replica: str) -> None:
        """Drop everything recorded for ``replica`` (its capacity setting stays)."""
        self._blocks.pop(replica, None)

    def size(self, replica: str) -> int:
        """Hashes currently kept for ``replica``."""
        return len(self._blocks.get(replica, ()))

    def _evict(self, replica: str) -> None:
        blocks = self._blocks.get(replica)
        if blocks is None:
            return
        limit = self.capacity(replica)
        while len(blocks) > limit:
            blocks.popitem(last=False)
