"""KV cache bookkeeping: fixed-size blocks, reference counts and a prefix cache.

Pure Python (no JAX): the device arrays live in ``runner.py``; this module only decides which
block holds which tokens. Block 0 is reserved as scratch (padding rows and tokens read and
write there), so usable blocks are ``1..num_blocks``.

Prefix cache: a full block of a sequence is identified by a chained hash
``h_i = hash((h_{i-1}, tokens of block i))``, so equal hashes mean equal whole prefixes (the
stored key is compared too, so a hash collision can never hand out wrong KV). A block whose
last user finished keeps its contents and its hash and goes to the end of an LRU list of free
blocks (a free block holding no full cached block goes to the front, to be reused first);
allocation takes the front (least recently used) free block and forgets its hash then. A
later request with the same prefix takes the cached blocks back (refcount > 0) and skips
their prefill.

Invariants (tested with Hypothesis): every usable block is either free (refcount 0, in the
free list) or in use (refcount > 0, not in the free list); refcounts are never negative.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

ROOT_HASH = 0
BlockKey = tuple[int, tuple[int, ...]]  # (parent hash, the block's tokens)


def chain_hash(parent: int, tokens: Sequence[int]) -> int:
    """The hash of a full block given its parent's hash (``ROOT_HASH`` for the first)."""
    return hash((parent, tuple(tokens)))


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of every full block of ``token_ids`` (the partial tail has none)."""
    out: list[int] = []
    parent = ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = chain_hash(parent, token_ids[start : start + block_size])
        out.append(parent)
    return out


class OutOfBlocksError(RuntimeError):
    """``allocate`` found no free block; the caller must wait or preempt."""


class BlockPool:
    """Allocates blocks, counts references, and caches full blocks by chained hash."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.refcount = [0] * (num_blocks + 1)  # index 0 = scratch, never handed out
        # Free blocks, least recently used first; cached ones keep their key until reused.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks + 1))
        self._by_hash: dict[int, tuple[int, BlockKey]] = {}  # hash -> (block, key)
        self._hash_of: dict[int, int] = {}  # block -> hash
        self.hits_blocks = 0

    @property
    def num_free(self) -> int:
        """Blocks that can be allocated now (cached-but-unused blocks included)."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def usage(self) -> float:
        """Fraction of blocks held by sequences (0..1), like vLLM's kv_cache_usage_perc."""
        return self.num_used / self.num_blocks

    def allocate(self) -> int:
        """Take the least recently used free block (dropping any cached prefix it held)."""
        if not self._free:
            raise OutOfBlocksError("no free KV blocks")
        block, _ = self._free.popitem(last=False)
        self._forget(block)
        self.refcount[block] = 1
        return block

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block; a block nobody uses becomes free (LRU end).

        Blocks are released last-first so that a sequence's tail is evicted before its
        head: the head is the part other requests are most likely to share.
        """
        for block in reversed(blocks):
            if self.refcount[block] <= 0:
                raise ValueError(f"block {block} released more often than taken")
            self.refcount[block] -= 1
            if self.refcount[block] == 0:
                self._free[block] = None
                if block not in self._hash_of:  # nothing worth keeping: reuse it first
                    self._free.move_to_end(block, last=False)

    def register(self, block: int, parent: int, tokens: Sequence[int]) -> int:
        """Record that ``block`` holds the full block ``tokens`` after prefix hash ``parent``.

        Returns the block's chained hash. A block already cached under that hash stays the
        canonical one; this block then simply is not shared.
        """
        key: BlockKey = (parent, tuple(tokens))
        h = hash(key)
        if h not in self._by_hash and block not in self._hash_of:
            self._by_hash[h] = (block, key)
            self._hash_of[block] = h
        return h

    def match_prefix(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        """Take the cached blocks that hold the longest prefix of ``token_ids`` (whole blocks,
        at most ``max_tokens`` tokens). Each returned block gains a reference."""
        found: list[int] = []
        parent = ROOT_HASH
        bs = self.block_size
        for start in range(0, max_tokens - bs + 1, bs):
            key: BlockKey = (parent, tuple(token_ids[start : start + bs]))
            entry = self._by_hash.get(hash(key))
            if entry is None or entry[1] != key:
                break
            found.append(entry[0])
            parent = hash(key)
        for block in found:
            if self.refcount[block] == 0:
                del self._free[block]
            self.refcount[block] += 1
        self.hits_blocks += len(found)
        return found

    def cached_prefix_blocks(self, token_ids: Sequence[int]) -> int:
        """How many leading full blocks of ``token_ids`` are cached (no references taken)."""
        parent, n, bs = ROOT_HASH, 0, self.block_size
        for start in range(0, len(token_ids) - bs + 1, bs):
            key: BlockKey = (parent, tuple(token_ids[start : start + bs]))
            entry = self._by_hash.get(hash(key))
            if entry is None or entry[1] != key:
                break
            parent, n = hash(key), n + 1
        return n

    def _forget(self, block: int) -> None:
        h = self._hash_of.pop(block, None)
        if h is not None:
            self._by_hash.pop(h, None)
