"""Sticky routes for providers' prompt caches: the store-backed memory (policies/sticky.py)
and the pure plan reordering (routers/sticky.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from core.config_tenants import RedisConfig
from core.protocols import Timeouts
from core.wire import ChatRequest, FunctionDef, Message, TextPart, Tool
from policies.sticky import StickyRoutes, stable_prefix_hash
from policies.store.memory import MemoryStore
from policies.store.redis import RedisStore
from routers.sticky import prefer
from routers.targets import Target

pytestmark = pytest.mark.anyio


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


class CountingStore(MemoryStore):
    """A real MemoryStore that counts writes."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.sets = 0

    async def set(self, key: str, value: bytes, ttl_s: float | None = None) -> None:
        self.sets += 1
        await super().set(key, value, ttl_s)


# ---------------------------------------------------------------- StickyRoutes
async def test_remembers_per_tenant_and_prefix(store: Any, clock: FakeClock) -> None:
    sticky = StickyRoutes(store, ttl_s=300.0, clock=clock)
    assert await sticky.lookup("acme", "p1") is None
    await sticky.remember("acme", "p1", "claude/sonnet")
    assert await sticky.lookup("acme", "p1") == "claude/sonnet"
    assert await sticky.lookup("globex", "p1") is None
    assert await sticky.lookup("acme", "p2") is None
    await sticky.remember("acme", "p1", "openai/gpt")  # a new target took over
    assert await sticky.lookup("acme", "p1") == "openai/gpt"


async def test_mapping_expires_after_ttl(clock: FakeClock) -> None:
    sticky = StickyRoutes(MemoryStore(clock), ttl_s=300.0, clock=clock)
    await sticky.remember("acme", 123, "claude/sonnet")
    clock.advance(299.0)
    assert await sticky.lookup("acme", 123) == "claude/sonnet"
    clock.advance(2.0)
    assert await sticky.lookup("acme", 123) is None


async def test_hot_prefix_rewrites_at_most_every_quarter_ttl(clock: FakeClock) -> None:
    store = CountingStore(clock)
    sticky = StickyRoutes(store, ttl_s=300.0, clock=clock)
    for _ in range(50):
        await sticky.remember("acme", "p", "a/x")
        clock.advance(2.0)  # 100 s in all
    assert store.sets == 2  # at t=0 and t=76 (first call after 75 s)
    await sticky.remember("acme", "p", "b/y")  # a changed label is written at once
    assert store.sets == 3
    # Used every 2 s, the entry never lapses although 300 s have long passed since t=0.
    for _ in range(200):
        await sticky.remember("acme", "p", "b/y")
        clock.advance(2.0)
    assert await sticky.lookup("acme", "p") == "b/y"


async def test_unreachable_store_means_no_sticky_target(clock: FakeClock) -> None:
    store = RedisStore(RedisConfig(url="redis://127.0.0.1:1/0", timeout_s=0.2), clock)
    try:
        sticky = StickyRoutes(store, ttl_s=300.0, clock=clock)
        await sticky.remember("acme", "p", "a/x")
        assert await sticky.lookup("acme", "p") is None
        assert sticky.errors == 2
    finally:
        await store.aclose()


# ---------------------------------------------------------------- stable_prefix_hash
SYSTEM = "You are a careful assistant. " * 200  # ~5,800 characters


def chat(*messages: Message, tools: list[Tool] | None = None) -> ChatRequest:
    return ChatRequest(model="m", messages=list(messages), tools=tools)


def test_prefix_hash_ignores_the_conversation_after_the_system_prompt() -> None:
    a = stable_prefix_hash(chat(Message("system", SYSTEM), Message("user", "Hi")), 4096)
    b = stable_prefix_hash(chat(Message("system", SYSTEM), Message("user", "Other")), 4096)
    parts = chat(Message("system", [TextPart(SYSTEM)]), Message("user", "Hi"))
    assert a is not None
    assert a == b == stable_prefix_hash(parts, 4096)
    other = stable_prefix_hash(chat(Message("system", SYSTEM + "!"), Message("user", "Hi")), 4096)
    assert other not in (None, a)


def test_prefix_hash_covers_tools_and_needs_min_chars() -> None:
    short = chat(Message("system", "Be brief"), Message("user", "Hi"))
    assert stable_prefix_hash(short, 4096) is None
    assert stable_prefix_hash(short, 4) is not None
    tool = Tool(FunctionDef("lookup", "x" * 5000))
    with_tools = stable_prefix_hash(chat(Message("user", "Hi"), tools=[tool]), 4096)
    assert with_tools is not None
    assert with_tools != stable_prefix_hash(
        chat(Message("user", "Hi"), tools=[Tool(FunctionDef("lookup", "y" * 5000))]), 4096
    )


# ---------------------------------------------------------------- prefer
class NoProvider:
    name = "none"


def target(label: str) -> Target:
    provider, model = label.split("/")
    return Target(
        alias="chat",
        provider_name=provider,
        model=model,
        provider=NoProvider(),
        timeouts=Timeouts(),
    )  # type: ignore[arg-type]


PLAN = [target("a/1"), target("b/2"), target("c/3")]


def labels(plan: list[Target]) -> list[str]:
    return [t.label for t in plan]


def test_sticky_target_moves_to_the_front() -> None:
    plan, reason = prefer(PLAN, "c/3")
    assert labels(plan) == ["c/3", "a/1", "b/2"]
    assert reason is not None and "c/3" in reason
    assert labels(PLAN) == ["a/1", "b/2", "c/3"]  # the input is not mutated


def test_sticky_target_outside_the_plan_is_never_added() -> None:
    assert prefer(PLAN, "d/4") == (PLAN, None)
    assert prefer(PLAN, None) == (PLAN, None)
    assert prefer([], "a/1") == ([], None)


@given(st.permutations(["a/1", "b/2", "c/3", "d/4"]), st.sampled_from(["a/1", "b/2", "x/9"]))
def test_prefer_is_a_permutation_led_by_the_sticky_target(order: list[str], sticky: str) -> None:
    plan = [target(label) for label in order]
    result, reason = prefer(plan, sticky)
    assert sorted(labels(result)) == sorted(order)
    if sticky in order:
        assert labels(result)[0] == sticky
        assert [x for x in labels(result) if x != sticky] == [x for x in order if x != sticky]
    else:
        assert labels(result) == order and reason is None
