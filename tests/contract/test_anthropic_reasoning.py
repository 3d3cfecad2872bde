"""AnthropicProvider and reasoning, against the fake Anthropic over real HTTP: the fake checks
the ``thinking`` request as Anthropic does (budget, max_tokens, sampling, forced tools, tool
loops) and answers with Anthropic's exact thinking blocks and stream events."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import msgspec
import pytest

from core.config import AnthropicProviderConfig
from core.protocols import CallContext, Timeouts
from core.wire import (
    ChatRequest,
    FunctionCall,
    FunctionDef,
    Message,
    StreamOptions,
    Tool,
    ToolCall,
)
from providers.anthropic import AnthropicProvider
from providers.transport import make_client
from tests.fixtures.fake_anthropic import REPLY_TEXT, THINKING_TEXT, THINKING_TOKENS, FakeAnthropic
from tests.fixtures.server import serve

pytestmark = pytest.mark.anyio

HELLO = [Message("user", "Hi")]
WEATHER = Tool(
    FunctionDef(
        "get_weather",
        "Weather by city",
        {"type": "object", "properties": {"city": {"type": "string"}}},
    )
)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeAnthropic, str]]:
    app = FakeAnthropic()
    with serve(app) as server:
        yield app, server.url


@pytest.fixture
def fake(served: tuple[FakeAnthropic, str]) -> FakeAnthropic:
    served[0].requests.clear()
    return served[0]


@asynccontextmanager
async def anthropic(base_url: str) -> AsyncIterator[AnthropicProvider]:
    async with make_client() as client:
        cfg = AnthropicProviderConfig(base_url=base_url, default_max_tokens=2048)
        yield AnthropicProvider("claude", client, cfg, "sk-ant-test")


def ctx(model: str) -> CallContext:
    return CallContext(request_id="req-1", upstream_model=model, timeouts=Timeouts(total=10.0))


def chat_request(messages: list[Message] = HELLO, **options: Any) -> ChatRequest:
    return ChatRequest(model="claude-alias", messages=messages, **options)


async def test_effort_enables_thinking_that_anthropic_accepts(
    served: tuple[FakeAnthropic, str], fake: FakeAnthropic
) -> None:
    req = chat_request(reasoning_effort="medium", temperature=0.7, top_k=5)
    async with anthropic(served[1]) as provider:
        result = await provider.chat(req, ctx("m-ok"))
    sent = fake.requests[-1].json
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert sent["max_tokens"] == 2048 + 4096
    assert "temperature" not in sent and "top_k" not in sent
    message = result.response.choices[0].message
    assert (message.content, message.reasoning_content) == (REPLY_TEXT, THINKING_TEXT)
    # thinking is inside output_tokens and Anthropic gives no breakdown: none is invented
    usage = msgspec.to_builtins(result.response.usage)
    assert usage == {
        "prompt_tokens": 11,
        "completion_tokens": 5 + THINKING_TOKENS,
        "total_tokens": 16 + THINKING_TOKENS,
    }


async def test_redacted_thinking_is_dropped(served: tuple[FakeAnthropic, str]) -> None:
    async with anthropic(served[1]) as provider:
        result = await provider.chat(chat_request(reasoning_effort="low"), ctx("m-thinking"))
    assert result.response.choices[0].message.reasoning_content == THINKING_TEXT


async def test_stream_thinking_deltas_then_text(served: tuple[FakeAnthropic, str]) -> None:
    req = chat_request(
        reasoning_effort="high",
        max_tokens=40000,
        stream=True,
        stream_options=StreamOptions(include_usage=True),
    )
    async with anthropic(served[1]) as provider:
        chunks = [part.chunk async for part in provider.stream_chat(req, ctx("m-thinking"))]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.reasoning_content or "" for d in deltas) == THINKING_TEXT
    assert "".join(d.content or "" for d in deltas) == REPLY_TEXT
    first_text = next(i for i, d in enumerate(deltas) if d.content)
    assert all(d.reasoning_content is None for d in deltas[first_text:])
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5 + THINKING_TOKENS


async def test_tool_loop_and_forced_tools_go_through_without_thinking(
    served: tuple[FakeAnthropic, str], fake: FakeAnthropic
) -> None:
    call = ToolCall("toolu_1", FunctionCall("get_weather", '{"city": "Paris"}'))
    loop = [
        *HELLO,
        Message("assistant", tool_calls=[call]),
        Message("tool", "sunny", tool_call_id="toolu_1"),
    ]
    async with anthropic(served[1]) as provider:
        await provider.chat(
            chat_request(loop, tools=[WEATHER], reasoning_effort="high"), ctx("m-ok")
        )
        assert "thinking" not in fake.requests[-1].json
        forced = chat_request(tools=[WEATHER], tool_choice="required", reasoning_effort="low")
        result = await provider.chat(forced, ctx("m-tool"))
    assert "thinking" not in fake.requests[-1].json
    assert result.response.choices[0].finish_reason == "tool_calls"


async def test_no_effort_sends_no_thinking(
    served: tuple[FakeAnthropic, str], fake: FakeAnthropic
) -> None:
    async with anthropic(served[1]) as provider:
        result = await provider.chat(chat_request(reasoning_effort="none"), ctx("m-thinking"))
    assert "thinking" not in fake.requests[-1].json
    assert result.response.choices[0].message.reasoning_content is None


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 512}}, "greater than or equal to 1024"),
        ({"thinking": {"type": "enabled", "budget_tokens": 4096}}, "`max_tokens` must be greater"),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 1024}, "temperature": 0.5},
            "`temperature`",
        ),
    ],
)
async def test_the_fake_refuses_what_anthropic_refuses(
    served: tuple[FakeAnthropic, str], extra: dict[str, Any], why: str
) -> None:
    # Guards the tests above: a body the adapter got wrong would be refused, as upstream.
    body = {
        "model": "m-ok",
        "max_tokens": 2048,
        "messages": [{"role": "user", "content": "Hi"}],
        **extra,
    }
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{served[1]}/v1/messages", json=body, headers=headers)
    assert response.status_code == 400
    assert why in response.json()["error"]["message"]
