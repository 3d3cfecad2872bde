"""The exact-repeat response cache: decisions, keys, storage on both store backends, and
the stream replay / accumulation pair."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.clock import FakeClock
from core.config_routing import ResponseCacheConfig
from core.config_tenants import RedisConfig
from core.wire import (
    AssistantMessage,
    ChatChunk,
    ChatRequest,
    ChatResponse,
    Choice,
    FunctionCall,
    Message,
    ToolCall,
    make_usage,
)
from policies.response_cache import ResponseCache, canonical_body, deterministic
from policies.response_cache_stream import StreamAccumulator, accumulate, chunks_of
from policies.store.memory import MemoryStore
from policies.store.redis import RedisStore

pytestmark = pytest.mark.anyio

ON = ResponseCacheConfig(enabled=True, ttl_s=60.0, max_entries=3, max_entry_bytes=4096)
BODY: dict[str, Any] = {
    "model": "chat",
    "temperature": 0,
    "messages": [{"role": "user", "content": "Hi"}],
}


def raw(**changes: Any) -> bytes:
    return json.dumps({**BODY, **changes}).encode()


def request(**options: Any) -> ChatRequest:
    return ChatRequest(model="chat", messages=[Message("user", "Hi")], **options)


def answer(text: str = "Hello!", rid: str = "chatcmpl-1") -> ChatResponse:
    message = AssistantMessage(content=text)
    return ChatResponse(
        id=rid,
        created=1_700_000_000,
        model="m",
        choices=[Choice(0, message, "stop")],
        usage=make_usage(3, 2),
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield MemoryStore(clock)
        return
    url = request.getfixturevalue("redis_url")
    redis = RedisStore(RedisConfig(url=url, key_prefix="t:", timeout_s=1.0), clock)
    try:
        yield redis
    finally:
        await redis.aclose()


# ---------------------------------------------------------------- decisions
@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"temperature": 0.0}, True),
        ({"seed": 7, "temperature": 0.9}, True),
        ({"temperature": 0.0, "n": 1}, True),
        ({}, False),  # default temperature 1: sampled
        ({"temperature": 0.2}, False),
        ({"temperature": 0.0, "n": 2}, False),
        ({"seed": 1, "n": 3}, False),
    ],
)
def test_only_deterministic_requests_are_cacheable(options: dict[str, Any], expected: bool) -> None:
    cache = ResponseCache(ON, MemoryStore(FakeClock()), FakeClock())
    assert deterministic(request(**options)) is expected
    assert cache.cacheable(request(**options), {}) is expected
    assert cache.readable(request(**options), {}) is expected


@pytest.mark.parametrize(
    ("header", "read", "write"),
    [
        ("no-store", False, False),
        ("No-Store, max-age=0", False, False),
        ("no-cache", False, True),
        ("max-age=0, no-cache", False, True),
        ("max-age=60", True, True),
    ],
)
def test_client_cache_control_directives(header: str, read: bool, write: bool) -> None:
    cache = ResponseCache(ON, MemoryStore(FakeClock()), FakeClock())
    deterministic_req = request(temperature=0.0)
    assert cache.readable(deterministic_req, {"Cache-Control": header}) is read
    assert cache.cacheable(deterministic_req, {"cache-control": header}) is write


def test_disabled_cache_never_reads_or_writes() -> None:
    cache = ResponseCache(ResponseCacheConfig(enabled=False), MemoryStore(), FakeClock())
    assert not cache.cacheable(request(temperature=0.0), {})
    assert not cache.readable(request(temperature=0.0), {})


# ---------------------------------------------------------------- keys
def test_key_is_scoped_by_tenant_and_model_version() -> None:
    cache = ResponseCache(ON, MemoryStore(), FakeClock())
    base = cache.key("acme", "v1", raw())
    assert cache.key("acme", "v1", raw()) == base
    assert cache.key("globex", "v1", raw()) != base
    assert cache.key(None, "v1", raw()) != base
    assert cache.key("acme", "v2", raw()) != base


@pytest.mark.parametrize(
    "change",
    [
        {"messages": [{"role": "user", "content": "Hi!"}]},
        {
            "messages": [
                {"role": "system", "content": "Be brief"},
                {"role": "user", "content": "Hi"},
            ]
        },
        {"model": "other-alias"},
        {"temperature": 0.5},
        {"top_p": 0.5},
        {"max_tokens": 10},
        {"max_completion_tokens": 10},
        {"stop": ["\n"]},
        {"seed": 1},
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"tool_choice": "required"},
        {"response_format": {"type": "json_object"}},
        {"presence_penalty": 0.1},
        {"frequency_penalty": 0.1},
        {"logit_bias": {"50256": -100}},
        {"logprobs": True},
        {"reasoning_effort": "high"},
        {"some_vendor_extension": {"a": 1}},  # unknown fields are forwarded, so they count
    ],
)
def test_any_output_relevant_change_changes_the_key(change: dict[str, Any]) -> None:
    cache = ResponseCache(ON, MemoryStore(), FakeClock())
    assert cache.key("acme", "v1", raw(**change)) != cache.key("acme", "v1", raw())


@pytest.mark.parametrize(
    "change",
    [
        {"stream": True},
        {"stream": True, "stream_options": {"include_usage": True}},
        {"user": "end-user-42"},
        {"metadata": {"run": "7"}},
        {"store": True},
        {"prompt_cache_key": "tenant-a"},
        {"temperature": 0.0},  # 0.0 and 0 are the same number
    ],
)
def test_metadata_only_changes_keep_the_key(change: dict[str, Any]) -> None:
    cache = ResponseCache(ON, MemoryStore(), FakeClock())
    assert cache.key("acme", "v1", raw(**change)) == cache.key("acme", "v1", raw())


def test_canonical_form_ignores_key_order_and_whitespace() -> None:
    a = b'{"model":"chat","temperature":0,"messages":[{"role":"user","content":"Hi"}]}'
    b = b'{ "messages": [ {"content": "Hi", "role": "user"} ],\n "temperature": 0.0, "model": "chat" }'
    assert canonical_body(a) == canonical_body(b)
    assert json.loads(canonical_body(a)) == {
        "messages": [{"content": "Hi", "role": "user"}],
        "model": "chat",
        "temperature": 0,
    }


# ---------------------------------------------------------------- storage
async def test_miss_then_hit_returns_the_stored_answer(store: Any, clock: FakeClock) -> None:
    cache = ResponseCache(ON, store, clock)
    key = cache.key("acme", "v1", raw())
    assert await cache.get(key) is None
    await cache.put(key, answer())
    clock.advance(5.0)
    hit = await cache.get(key)
    assert hit is not None
    assert hit.response == answer()
    assert hit.age_s(clock.wall()) == pytest.approx(5.0)


async def test_other_tenant_same_body_misses(store: Any, clock: FakeClock) -> None:
    cache = ResponseCache(ON, store, clock)
    await cache.put(cache.key("acme", "v1", raw()), answer())
    assert await cache.get(cache.key("globex", "v1", raw())) is None
    assert await cache.get(cache.key("acme", "v1", raw(max_tokens=5))) is None


async def test_entries_over_the_size_limit_are_not_stored(store: Any, clock: FakeClock) -> None:
    cache = ResponseCache(ON, store, clock)
    key = cache.key("acme", "v1", raw())
    await cache.put(key, answer("x" * 5000))
    assert await cache.get(key) is None
    assert cache.too_big == 1
    await cache.put(key, answer("x" * 3000))
    assert await cache.get(key) is not None


async def test_entries_expire_after_ttl_on_the_memory_store(clock: FakeClock) -> None:
    cache = ResponseCache(ON, MemoryStore(clock), clock)
    key = cache.key("acme", "v1", raw())
    await cache.put(key, answer())
    clock.advance(59.0)
    assert await cache.get(key) is not None
    clock.advance(2.0)
    assert await cache.get(key) is None


async def test_redis_entries_carry_the_ttl(redis_url: str, clock: FakeClock) -> None:
    store = RedisStore(RedisConfig(url=redis_url, key_prefix="t:"), clock)
    try:
        cache = ResponseCache(ON, store, clock)
        key = cache.key("acme", "v1", raw())
        await cache.put(key, answer())
        ttl_ms = await store.client.pttl(store.key(key))
        assert 55_000 < ttl_ms <= 60_000
    finally:
        await store.aclose()


async def test_memory_cache_evicts_least_recently_used(clock: FakeClock) -> None:
    cache = ResponseCache(ON, MemoryStore(clock), clock)  # max_entries=3
    keys = [cache.key("acme", "v1", raw(seed=i)) for i in range(4)]
    for key in keys[:3]:
        await cache.put(key, answer())
    assert await cache.get(keys[0]) is not None  # 0 is now the most recently used
    await cache.put(keys[3], answer())
    assert await cache.get(keys[1]) is None  # the least recently used went
    assert [await cache.get(k) is not None for k in (keys[0], keys[2], keys[3])] == [True] * 3


async def test_unreachable_store_is_a_miss_and_a_skipped_write(clock: FakeClock) -> None:
    # Nothing listens on port 1: every command fails as an outage.
    store = RedisStore(RedisConfig(url="redis://127.0.0.1:1/0", timeout_s=0.2), clock)
    try:
        cache = ResponseCache(ON, store, clock)
        key = cache.key("acme", "v1", raw())
        await cache.put(key, answer())
        assert await cache.get(key) is None
        assert cache.errors == 2
    finally:
        await store.aclose()


async def test_unreadable_entry_is_a_miss(clock: FakeClock) -> None:
    store = MemoryStore(clock)
    cache = ResponseCache(ON, store, clock)
    key = cache.key("acme", "v1", raw())
    await store.set(key, b"not json")
    assert await cache.get(key) is None


# ---------------------------------------------------------------- stream replay
def tool_answer() -> ChatResponse:
    calls = [
        ToolCall("call_1", FunctionCall("get_weather", '{"city": "Paris"}')),
        ToolCall("call_2", FunctionCall("get_time", "")),
    ]
    message = AssistantMessage(content=None, tool_calls=calls)
    return ChatResponse(
        id="chatcmpl-2",
        created=5,
        model="m",
        system_fingerprint="fp_1",
        choices=[Choice(0, message, "tool_calls")],
        usage=make_usage(9, 4, 3),
    )


def test_chunks_follow_openais_stream_shape() -> None:
    chunks = chunks_of(tool_answer(), include_usage=True)
    shape = [msgspec.to_builtins(c) for c in chunks]
    deltas = [
        (c["choices"][0]["delta"], c["choices"][0]["finish_reason"]) if c["choices"] else c["usage"]
        for c in shape
    ]
    assert deltas == [
        ({"role": "assistant"}, None),
        (
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            },
            None,
        ),
        ({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]}, None),
        (
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_time", "arguments": ""},
                    }
                ]
            },
            None,
        ),
        ({}, "tool_calls"),
        {
            "prompt_tokens": 9,
            "completion_tokens": 4,
            "total_tokens": 13,
            "prompt_tokens_details": {"cached_tokens": 3},
        },
    ]
    assert all(
        c["object"] == "chat.completion.chunk"
        and c["id"] == "chatcmpl-2"
        and c["system_fingerprint"] == "fp_1"
        for c in shape
    )
    assert shape[-1]["choices"] == []


def test_without_include_usage_no_usage_chunk() -> None:
    chunks = chunks_of(answer(), include_usage=False)
    assert all(c.usage is None and c.choices for c in chunks)
    assert [c.choices[0].delta.content for c in chunks] == ["", "Hello!", None]
    assert accumulate(chunks) == msgspec.structs.replace(answer(), usage=None)


def test_accumulator_merges_fragmented_upstream_deltas() -> None:
    frames = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
        {"choices": [{"index": 0, "delta": {"content": "lo"}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "f", "arguments": ""},
                            }
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]},
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]},
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}},
    ]
    decoder = msgspec.json.Decoder(ChatChunk)
    acc = StreamAccumulator()
    for i, frame in enumerate(frames):
        assert not acc.finished or i == len(frames) - 1
        acc.add(
            decoder.decode(
                json.dumps(
                    {
                        "object": "chat.completion.chunk",
                        "id": "x",
                        "created": 1,
                        "model": "m",
                        **frame,
                    }
                )
            )
        )
    assert acc.finished
    result = acc.result()
    assert result.choices[0].message == AssistantMessage(
        content="Hello", tool_calls=[ToolCall("c1", FunctionCall("f", '{"a": 1}'))]
    )
    assert result.choices[0].finish_reason == "tool_calls"
    assert result.usage == make_usage(1, 2)


def test_unfinished_stream_is_not_complete() -> None:
    chunks = chunks_of(answer(), include_usage=False)[:-1]  # no finish chunk
    acc = StreamAccumulator().add_all(chunks)
    assert not acc.finished
    assert not StreamAccumulator().finished


texts = st.text(max_size=20)
tool_calls = st.lists(
    st.builds(
        ToolCall,
        id=st.text(min_size=1, max_size=8),
        function=st.builds(FunctionCall, name=st.text(min_size=1, max_size=8), arguments=texts),
    ),
    min_size=1,
    max_size=3,
)
messages = st.builds(
    AssistantMessage,
    content=st.none() | texts,
    tool_calls=st.none() | tool_calls,
    refusal=st.none() | texts,
)
logprobs = st.none() | st.builds(
    lambda n: {"content": [{"token": str(i)} for i in range(n)], "refusal": None}, st.integers(0, 3)
)
finish = st.none() | st.sampled_from(["stop", "length", "tool_calls", "content_filter"])
usages = st.none() | st.builds(
    make_usage, st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 100)
)


@st.composite
def responses(draw: st.DrawFn) -> ChatResponse:
    count = draw(st.integers(1, 3))
    choices = [Choice(i, draw(messages), draw(finish), draw(logprobs)) for i in range(count)]
    return ChatResponse(
        id=draw(st.text(min_size=1, max_size=10)),
        created=draw(st.integers(0, 2**31)),
        model=draw(st.text(min_size=1, max_size=10)),
        choices=choices,
        usage=draw(usages),
        system_fingerprint=draw(st.none() | texts),
    )


@settings(max_examples=200, deadline=None)
@given(responses())
def test_accumulating_the_replay_gives_back_the_response(response: ChatResponse) -> None:
    assert accumulate(chunks_of(response, include_usage=True)) == response
    # ...and through the wire: what a client would actually receive, re-decoded.
    decoder = msgspec.json.Decoder(ChatChunk)
    wired = [decoder.decode(msgspec.json.encode(c)) for c in chunks_of(response, True)]
    assert accumulate(wired) == response
