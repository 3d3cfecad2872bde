"""routers.prefix (chained block hashes, canonical prompt text) and local_tier.prefix_index
(the router-side approximate index of which replica holds which prefix blocks)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from core.wire import ChatRequest
from local_tier.prefix_index import PrefixIndex
from routers.prefix import prefix_hashes, prompt_text


def chat(messages: list[dict[str, object]], **extra: object) -> ChatRequest:
    body = {"model": "m", "messages": messages, **extra}
    return msgspec.convert(body, ChatRequest)


ROOT = Path(__file__).resolve().parents[2]
SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 40}


# ---------------------------------------------------------------- prefix_hashes
def test_only_full_blocks_are_hashed_and_the_cap_holds() -> None:
    assert prefix_hashes("x" * 63, block_chars=64) == ()
    assert len(prefix_hashes("x" * 64, block_chars=64)) == 1
    assert len(prefix_hashes("x" * 200, block_chars=64)) == 3
    assert len(prefix_hashes("x" * 10_000, block_chars=8, max_blocks=5)) == 5
    assert prefix_hashes("x" * 100, max_blocks=0) == ()
    with pytest.raises(ValueError):
        prefix_hashes("abc", block_chars=0)


def test_hashes_are_chained_not_per_block() -> None:
    # Equal second blocks after different first blocks must hash differently.
    a = prefix_hashes("A" * 4 + "same", block_chars=4)
    b = prefix_hashes("B" * 4 + "same", block_chars=4)
    assert a[1] != b[1]
    # ...while equal leading blocks hash equally.
    c = prefix_hashes("A" * 4 + "diff", block_chars=4)
    assert a[0] == c[0] and a[1] != c[1]


def test_hash_is_blake2b_of_the_whole_prefix() -> None:
    # The documented construction: hash i = blake2b-64 of blocks 0..i (the running digest).
    text = "abcdefgh" * 3
    expected = tuple(
        int.from_bytes(hashlib.blake2b(text[: 8 * (i + 1)].encode(), digest_size=8).digest(), "big")
        for i in range(3)
    )
    assert prefix_hashes(text, block_chars=8) == expected


def test_stable_across_processes() -> None:
    # Python's own str hash is salted per process; ours must not be.
    code = "from routers.prefix import prefix_hashes; print(prefix_hashes('q' * 300 + 'ü' * 70))"
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed},
            cwd=ROOT,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1
    assert outputs.pop().strip() == str(prefix_hashes("q" * 300 + "ü" * 70))


@given(st.text(max_size=400), st.text(max_size=400), st.integers(1, 16))
def test_shared_leading_blocks_share_exactly_the_leading_hashes(a: str, b: str, size: int) -> None:
    ha, hb = prefix_hashes(a, size), prefix_hashes(b, size)
    common_chars = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    shared_blocks = min(common_chars // size, len(ha), len(hb))
    assert ha[:shared_blocks] == hb[:shared_blocks]
    if shared_blocks < min(len(ha), len(hb)):
        assert ha[shared_blocks] != hb[shared_blocks]  # 64-bit collisions aside


# ---------------------------------------------------------------- prompt_text
def test_growing_conversation_keeps_its_leading_hashes() -> None:
    turn1 = chat([SYSTEM, {"role": "user", "content": "What is a monad?"}])
    turn2 = chat(
        [
            SYSTEM,
            {"role": "user", "content": "What is a monad?"},
            {"role": "assistant", "content": "A monoid in the category of endofunctors."},
            {"role": "user", "content": "Explain it simply, please."},
        ]
    )
    t1, t2 = prompt_text(turn1), prompt_text(turn2)
    assert t2.startswith(t1)
    h1, h2 = prefix_hashes(t1), prefix_hashes(t2)
    assert len(h2) > len(h1) > 10
    assert h2[: len(h1)] == h1


def test_same_system_prompt_different_question_shares_the_system_blocks() -> None:
    a = prefix_hashes(prompt_text(chat([SYSTEM, {"role": "user", "content": "hi"}])))
    b = prefix_hashes(prompt_text(chat([SYSTEM, {"role": "user", "content": "bye"}])))
    system_blocks = len(SYSTEM["content"]) // 64  # type: ignore[arg-type]
    assert a[: system_blocks - 1] == b[: system_blocks - 1]


def test_roles_and_message_boundaries_matter() -> None:
    as_user = prompt_text(chat([{"role": "user", "content": "hello"}]))
    as_system = prompt_text(chat([{"role": "system", "content": "hello"}]))
    split = prompt_text(
        chat([{"role": "user", "content": "hel"}, {"role": "user", "content": "lo"}])
    )
    assert len({as_user, as_system, split}) == 3


def test_tools_lead_and_their_key_order_does_not_matter() -> None:
    def tool(params: dict[str, object]) -> dict[str, object]:
        return {
            "type": "function",
            "function": {"name": "f", "description": "d", "parameters": params},
        }

    msgs = [{"role": "user", "content": "x"}]
    a = prompt_text(chat(msgs, tools=[tool({"type": "object", "properties": {}})]))
    b = prompt_text(chat(msgs, tools=[tool({"properties": {}, "type": "object"})]))
    c = prompt_text(chat(msgs))
    assert a == b != c
    assert a.index("tool") < a.index("user")


def test_sampling_parameters_do_not_change_the_text() -> None:
    msgs = [SYSTEM, {"role": "user", "content": "q"}]
    assert prompt_text(chat(msgs, temperature=0)) == prompt_text(chat(msgs, max_tokens=5))


def test_image_parts_become_short_digests() -> None:
    def with_image(url: str) -> str:
        return prompt_text(
            chat(
                [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "look"},
                            {"type": "image_url", "image_url": {"url": url}},
                        ],
                    }
                ]
            )
        )

    big = "data:image/png;base64," + "A" * 100_000
    assert len(with_image(big)) < 200
    assert with_image(big) != with_image(big + "B")
    assert with_image(big) == with_image(big)


def test_tool_calls_and_results_are_part_of_the_text() -> None:
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
        ],
    }
    result = {"role": "tool", "tool_call_id": "c1", "content": "42"}
    text = prompt_text(chat([{"role": "user", "content": "q"}, call, result]))
    assert '{"a":1}' in text and "c1" in text and "42" in text


# ---------------------------------------------------------------- PrefixIndex
def test_record_then_match_leading_blocks() -> None:
    index = PrefixIndex(100, FakeClock())
    index.record("r1", (1, 2, 3, 4))
    assert index.matched("r1", (1, 2, 3, 4, 5)) == 4
    assert index.matched("r1", (1, 2, 9, 4)) == 2  # a gap ends the match
    assert index.matched("r1", (9, 1, 2)) == 0
    assert index.matched("r2", (1, 2)) == 0
    assert index.matched("r1", ()) == 0


def test_lru_eviction_is_bounded_and_trims_tails_first() -> None:
    index = PrefixIndex(6, FakeClock())
    index.record("r", (1, 2, 3, 4))
    index.record("r", (10, 20, 30, 40))
    assert index.size("r") == 6
    # The older prompt lost its tail, not its head, so it still matches two leading blocks.
    assert index.matched("r", (1, 2, 3, 4)) == 2
    assert index.matched("r", (10, 20, 30, 40)) == 4


def test_recording_again_refreshes_and_matching_does_not() -> None:
    index = PrefixIndex(4, FakeClock())
    index.record("r", (1, 2))
    index.record("r", (3, 4))
    index.matched("r", (1, 2))  # a read: must not save (1, 2) from eviction
    index.record("r", (5,))
    assert index.matched("r", (1, 2)) == 1  # 2 (the older tail) went first
    index.record("r", (1, 2))
    index.record("r", (6, 7))
    assert index.matched("r", (1, 2)) == 2
    assert index.matched("r", (3, 4)) == 0


def test_capacity_from_the_kv_pool_and_forget() -> None:
    index = PrefixIndex(1000, FakeClock(), block_chars=64)
    index.set_capacity_tokens("r", 128)  # 128 tokens * 4 chars / 64 = 8 blocks
    assert index.capacity("r") == 8
    index.record("r", tuple(range(20)))
    assert index.size("r") == 8 and index.matched("r", tuple(range(20))) == 8
    index.set_capacity("r", 3)  # shrinking evicts at once
    assert index.size("r") == 3
    assert index.capacity("other") == 1000
    index.forget("r")
    assert index.matched("r", (0, 1)) == 0 and index.size("r") == 0
    with pytest.raises(ValueError):
        PrefixIndex(0, FakeClock())


def test_ttl_expires_old_entries() -> None:
    clock = FakeClock()
    index = PrefixIndex(100, clock, ttl_s=60)
    index.record("r", (1, 2))
    clock.advance(30)
    index.record("r", (1,))  # refreshes block 1 only
    clock.advance(40)
    assert index.matched("r", (1, 2)) == 1


@given(
    st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=8), max_size=30), st.integers(1, 12)
)
def test_index_never_exceeds_capacity_and_last_record_matches_fully(
    prompts: list[list[int]], capacity: int
) -> None:
    index = PrefixIndex(capacity, FakeClock())
    for hashes in prompts:
        index.record("r", hashes)
        assert index.size("r") <= capacity
        distinct = list(dict.fromkeys(hashes))  # duplicates collapse to one entry
        if len(distinct) <= capacity and distinct == hashes:
            assert index.matched("r", hashes) == len(hashes)
