"""Block pool and prefix cache: invariants under random operations, LRU eviction, matching."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from local_tier.jax.kv_cache import BlockPool, OutOfBlocksError, block_hashes, chain_hash


def check_invariants(pool: BlockPool, held: list[list[int]]) -> None:
    counts = [0] * (pool.num_blocks + 1)
    for blocks in held:
        for b in blocks:
            counts[b] += 1
    assert all(c >= 0 for c in pool.refcount)
    assert pool.refcount[1:] == counts[1:]  # refcounts are exactly the references held
    in_use = sum(1 for c in counts[1:] if c > 0)
    assert in_use + pool.num_free == pool.num_blocks  # allocated + free = total
    assert 0.0 <= pool.usage() <= 1.0


ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "release", "register", "match"]), st.integers(0, 50)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_random_operations_keep_invariants(script: list[tuple[str, int]]) -> None:
    pool = BlockPool(num_blocks=8, block_size=2)
    held: list[list[int]] = []
    for op, arg in script:
        if op == "alloc":
            try:
                held.append([pool.allocate()])
            except OutOfBlocksError:
                assert pool.num_free == 0
        elif op == "release" and held:
            pool.release(held.pop(arg % len(held)))
        elif op == "register" and held and held[arg % len(held)]:
            pool.register(held[arg % len(held)][0], 0, [arg % 3, arg % 5])
        elif op == "match":
            tokens = [arg % 3, arg % 5, 1, 1]
            held.append(pool.match_prefix(tokens, len(tokens)))
        check_invariants(pool, held)
    for blocks in held:
        pool.release(blocks)
    assert pool.num_free == pool.num_blocks


def test_release_more_than_taken_raises() -> None:
    pool = BlockPool(4, 4)
    b = pool.allocate()
    pool.release([b])
    with pytest.raises(ValueError):
        pool.release([b])


def test_block_zero_is_never_handed_out() -> None:
    pool = BlockPool(3, 4)
    got = {pool.allocate() for _ in range(3)}
    assert got == {1, 2, 3}
    with pytest.raises(OutOfBlocksError):
        pool.allocate()


def _cache_sequence(pool: BlockPool, tokens: list[int]) -> list[int]:
    blocks = [pool.allocate() for _ in range(len(tokens) // pool.block_size)]
    parent = 0
    for i, b in enumerate(blocks):
        parent = pool.register(b, parent, tokens[i * pool.block_size : (i + 1) * pool.block_size])
    return blocks


def test_prefix_match_finds_shared_full_blocks_only() -> None:
    pool = BlockPool(10, 4)
    a = list(range(12))
    blocks = _cache_sequence(pool, a)
    pool.release(blocks)
    b = [*a[:8], 99, 98, 97, 96]  # shares two full blocks
    found = pool.match_prefix(b, len(b))
    assert found == blocks[:2]
    assert all(pool.refcount[x] == 1 for x in found)
    assert pool.match_prefix([5, *a[1:]], 12) == []  # first block differs -> nothing


def test_match_respects_max_tokens() -> None:
    pool = BlockPool(10, 4)
    tokens = list(range(8))
    pool.release(_cache_sequence(pool, tokens))
    assert len(pool.match_prefix(tokens, 7)) == 1  # leave one token to compute


def test_lru_eviction_reuses_uncached_then_oldest_cached_blocks() -> None:
    pool = BlockPool(3, 2)
    old = _cache_sequence(pool, [1, 2])
    new = _cache_sequence(pool, [3, 4])
    scratch = pool.allocate()
    pool.release(old)
    pool.release(new)
    pool.release([scratch])  # uncached: must be reused first
    assert pool.allocate() == scratch
    assert pool.allocate() == old[0]  # least recently used cached block goes next
    assert pool.match_prefix([1, 2, 0], 2) == []  # its prefix was evicted
    assert pool.match_prefix([3, 4, 0], 2) == new


def test_block_hashes_chain() -> None:
    hs = block_hashes([1, 2, 3, 4, 5], 2)
    assert hs == [chain_hash(0, [1, 2]), chain_hash(chain_hash(0, [1, 2]), [3, 4])]
    assert block_hashes([9, 2, 3, 4], 2)[1] != hs[1]  # same block, different prefix
