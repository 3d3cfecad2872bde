"""GeminiProvider and reasoning, against the fake Gemini over real HTTP: ``reasoning_effort``
-> ``thinkingConfig``; thought parts -> ``reasoning_content``; ``thoughtsTokenCount`` ->
completion tokens and ``completion_tokens_details.reasoning_tokens``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec
import pytest

from core.config import GeminiProviderConfig
from core.protocols import CallContext, Timeouts
from core.wire import ChatRequest, StreamOptions
from providers.gemini import GeminiProvider
from providers.transport import make_client
from tests.fixtures.fake_gemini import API_KEY, TEXT, THOUGHT_TEXT, THOUGHT_TOKENS, FakeGemini
from tests.fixtures.server import serve

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeGemini, str]]:
    app = FakeGemini()
    with serve(app) as server:
        yield app, server.url


@pytest.fixture
def fake(served: tuple[FakeGemini, str]) -> FakeGemini:
    served[0].requests.clear()
    return served[0]


@contextlib.asynccontextmanager
async def gemini_at(base_url: str) -> AsyncIterator[GeminiProvider]:
    async with make_client() as client:
        yield GeminiProvider("gemini", client, GeminiProviderConfig(base_url=base_url), API_KEY)


def ctx(model: str) -> CallContext:
    return CallContext(request_id="req1", upstream_model=model, timeouts=Timeouts(total=10))


def request(**fields: Any) -> ChatRequest:
    fields.setdefault("messages", [{"role": "user", "content": "hi"}])
    return msgspec.convert({"model": "alias", **fields}, ChatRequest)


async def test_effort_sends_thinking_config_and_thoughts_come_back(
    served: tuple[FakeGemini, str], fake: FakeGemini
) -> None:
    async with gemini_at(served[1]) as gemini:
        result = await gemini.chat(request(reasoning_effort="medium"), ctx("m-ok"))
    assert fake.requests[-1].json["generationConfig"] == {
        "thinkingConfig": {"thinkingBudget": 8192, "includeThoughts": True}
    }
    message = result.response.choices[0].message
    assert (message.content, message.reasoning_content) == (TEXT, THOUGHT_TEXT)
    usage = msgspec.to_builtins(result.response.usage)
    assert usage == {
        "prompt_tokens": 11,
        "completion_tokens": 5 + THOUGHT_TOKENS,
        "total_tokens": 16 + THOUGHT_TOKENS,
        "completion_tokens_details": {"reasoning_tokens": THOUGHT_TOKENS},
    }


async def test_default_thinking_is_counted_even_without_thought_summaries(
    served: tuple[FakeGemini, str], fake: FakeGemini
) -> None:
    async with gemini_at(served[1]) as gemini:
        result = await gemini.chat(request(), ctx("m-thinking"))
    assert "generationConfig" not in fake.requests[-1].json
    assert result.response.choices[0].message.reasoning_content is None
    assert result.response.usage is not None
    assert result.response.usage.reasoning_tokens == THOUGHT_TOKENS
    assert result.response.usage.completion_tokens == 5 + THOUGHT_TOKENS


async def test_none_turns_thinking_off(served: tuple[FakeGemini, str], fake: FakeGemini) -> None:
    async with gemini_at(served[1]) as gemini:
        result = await gemini.chat(request(reasoning_effort="none"), ctx("m-thinking"))
    assert fake.requests[-1].json["generationConfig"] == {"thinkingConfig": {"thinkingBudget": 0}}
    assert result.response.usage is not None
    assert result.response.usage.reasoning_tokens == 0
    assert result.response.usage.completion_tokens_details is None


async def test_stream_sends_reasoning_deltas_first_and_reasoning_usage_last(
    served: tuple[FakeGemini, str],
) -> None:
    req = request(
        reasoning_effort="high", stream=True, stream_options=StreamOptions(include_usage=True)
    )
    async with gemini_at(served[1]) as gemini:
        chunks = [part.chunk async for part in gemini.stream_chat(req, ctx("m-thinking"))]
    deltas = [msgspec.to_builtins(c.choices[0].delta) for c in chunks if c.choices]
    assert deltas[:2] == [{"role": "assistant", "content": ""}, {"reasoning_content": THOUGHT_TEXT}]
    assert "".join(d.get("content", "") for d in deltas) == TEXT
    usage = chunks[-1].usage
    assert usage is not None and usage.reasoning_tokens == THOUGHT_TOKENS
