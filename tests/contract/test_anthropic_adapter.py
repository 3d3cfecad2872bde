"""AnthropicProvider against the fake Anthropic API over real HTTP (uvicorn + httpx)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
import pytest

from core.config import AnthropicProviderConfig
from core.errors import (
    InvalidRequestError,
    ProviderError,
    UpstreamAuthError,
    UpstreamBadRequestError,
    UpstreamMalformedError,
    UpstreamRateLimitedError,
    UpstreamServerError,
    UpstreamTimeoutError,
)
from core.protocols import CallContext, Timeouts
from core.wire import (
    ChatChunk,
    ChatRequest,
    FunctionCall,
    FunctionDef,
    ImagePart,
    ImageURL,
    JSONSchemaSpec,
    Message,
    ResponseFormat,
    StreamOptions,
    StreamPart,
    TextPart,
    Tool,
    ToolCall,
)
from providers.anthropic import AnthropicProvider
from providers.transport import make_client
from tests.fixtures.fake_anthropic import FakeAnthropic
from tests.fixtures.server import resetting_server, serve

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
    app = FakeAnthropic(slow_seconds=3.0)
    with serve(app) as server:
        yield app, server.url


@pytest.fixture
def fake(served: tuple[FakeAnthropic, str]) -> FakeAnthropic:
    app = served[0]
    app.requests.clear()
    app.disconnects.clear()
    return app


@pytest.fixture
def url(served: tuple[FakeAnthropic, str]) -> str:
    return served[1]


@asynccontextmanager
async def anthropic(
    base_url: str, api_key: str | None = "sk-ant-test", **config: Any
) -> AsyncIterator[AnthropicProvider]:
    async with make_client() as client:
        cfg = AnthropicProviderConfig(base_url=base_url, **config)
        yield AnthropicProvider("claude", client, cfg, api_key)


def ctx(model: str, total: float = 30.0) -> CallContext:
    return CallContext(
        request_id="req-1", upstream_model=model, timeouts=Timeouts(connect=5.0, total=total)
    )


def chat_request(messages: list[Message] = HELLO, **options: Any) -> ChatRequest:
    return ChatRequest(model="claude-alias", messages=messages, **options)


async def collect(parts: AsyncIterator[StreamPart]) -> tuple[list[ChatChunk], Exception | None]:
    """The chunks yielded before the generator ended, and what it raised (if anything)."""
    chunks: list[ChatChunk] = []
    try:
        async for part in parts:
            chunks.append(part.chunk)
    except ProviderError as exc:
        return chunks, exc
    return chunks, None


def shape(chunks: list[ChatChunk]) -> list[Any]:
    return [
        (msgspec.to_builtins(c.choices[0].delta), c.choices[0].finish_reason)
        if c.choices
        else msgspec.to_builtins(c.usage)
        for c in chunks
    ]


def text_of(chunks: list[ChatChunk]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


async def eventually(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    with anyio.move_on_after(seconds):
        while not check():
            await anyio.sleep(0.02)
    return check()


# ---------------------------------------------------------------- happy paths
async def test_chat_sends_anthropics_request_and_converts_the_answer(
    fake: FakeAnthropic,
    url: str,
) -> None:
    req = chat_request(
        [Message("system", "Be brief."), Message("user", "Hi"), Message("user", "there")],
        max_tokens=64,
        temperature=0.2,
        stop="END",
        user="u-7",
    )
    async with anthropic(url, headers={"anthropic-beta": "test-beta"}) as provider:
        result = await provider.chat(req, ctx("m-ok"))
    out = result.response
    assert out.choices[0].message.content == "Hello from anthropic!"
    assert out.choices[0].finish_reason == "stop"
    assert out.id.startswith("msg_fake") and out.model == "m-ok"
    assert (
        out.usage and (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens)
    ) == (11, 5, 16)
    [sent] = fake.requests
    assert (sent.method, sent.path, sent.query) == ("POST", "/v1/messages", "")
    assert sent.headers["x-api-key"] == "sk-ant-test"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.headers["content-type"] == "application/json"
    assert sent.headers["anthropic-beta"] == "test-beta"
    assert "authorization" not in sent.headers
    assert sent.json == {
        "model": "m-ok",
        "max_tokens": 64,
        "system": "Be brief.",
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}],
            }
        ],
        "stop_sequences": ["END"],
        "temperature": 0.2,
        "metadata": {"user_id": "u-7"},
    }


async def test_configured_version_and_default_max_tokens(fake: FakeAnthropic, url: str) -> None:
    async with anthropic(url, anthropic_version="2099-01-01", default_max_tokens=333) as provider:
        await provider.chat(chat_request(), ctx("m-ok"))
    assert fake.requests[0].headers["anthropic-version"] == "2099-01-01"
    assert fake.requests[0].json["max_tokens"] == 333


async def test_missing_api_key_is_refused_by_the_upstream(fake: FakeAnthropic, url: str) -> None:
    async with anthropic(url, api_key=None) as provider:
        with pytest.raises(UpstreamAuthError, match="x-api-key header is required"):
            await provider.chat(chat_request(), ctx("m-ok"))
    assert "x-api-key" not in fake.requests[0].headers


@pytest.mark.parametrize("include_usage", [False, True])
async def test_stream_is_openais_exact_chunk_sequence(
    fake: FakeAnthropic,
    url: str,
    include_usage: bool,
) -> None:
    options = {"stream_options": StreamOptions(include_usage=True)} if include_usage else {}
    async with anthropic(url) as provider:
        chunks, error = await collect(
            provider.stream_chat(chat_request(stream=True, **options), ctx("m-ok"))
        )
    assert error is None
    expected: list[Any] = [
        ({"role": "assistant", "content": ""}, None),
        ({"content": "Hello"}, None),
        ({"content": " from"}, None),
        ({"content": " anthropic!"}, None),
        ({}, "stop"),
    ]
    if include_usage:
        expected.append({"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16})
    assert shape(chunks) == expected
    assert len({(c.id, c.model, c.created) for c in chunks}) == 1
    assert chunks[0].id.startswith("msg_fake") and chunks[0].model == "m-ok"
    sent = fake.requests[0]
    assert sent.json["stream"] is True
    assert sent.headers["accept"] == "text/event-stream"


async def test_cached_usage_non_stream_and_stream(url: str, fake: FakeAnthropic) -> None:
    req = chat_request(stream_options=StreamOptions(include_usage=True))
    async with anthropic(url) as provider:
        result = await provider.chat(req, ctx("m-cached"))
        chunks, _ = await collect(provider.stream_chat(req, ctx("m-cached")))
    expected = {
        "prompt_tokens": 11,
        "completion_tokens": 5,
        "total_tokens": 16,
        "prompt_tokens_details": {"cached_tokens": 7, "cache_creation_tokens": 2},
    }
    assert msgspec.to_builtins(result.response.usage) == expected
    assert msgspec.to_builtins(chunks[-1].usage) == expected
    assert chunks[-1].choices == []


# ---------------------------------------------------------------- tools, json, images
async def test_tool_call_then_tool_result_turn(fake: FakeAnthropic, url: str) -> None:
    async with anthropic(url) as provider:
        first = await provider.chat(chat_request(tools=[WEATHER]), ctx("m-tool"))
        choice = first.response.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        [call] = choice.message.tool_calls or []
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        follow_up = [
            *HELLO,
            Message("assistant", None, tool_calls=[call]),
            Message("tool", "18C and sunny", tool_call_id=call.id),
        ]
        second = await provider.chat(chat_request(follow_up, tools=[WEATHER]), ctx("m-ok"))
    assert second.response.choices[0].message.content == "Hello from anthropic!"
    assert fake.requests[0].json["tools"] == [
        {
            "name": "get_weather",
            "description": "Weather by city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    assert fake.requests[1].json["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "18C and sunny"}
            ],
        },
    ]


async def test_streamed_tool_call(url: str, fake: FakeAnthropic) -> None:
    async with anthropic(url) as provider:
        chunks, error = await collect(
            provider.stream_chat(
                chat_request(tools=[WEATHER], parallel_tool_calls=False), ctx("m-tool")
            )
        )
    assert error is None
    rows = shape(chunks)
    assert rows[0] == ({"role": "assistant", "content": ""}, None)
    first = rows[1][0]["tool_calls"][0]
    assert first["index"] == 0 and first["id"].startswith("toolu_fake")
    assert (first["type"], first["function"]) == (
        "function",
        {"name": "get_weather", "arguments": ""},
    )
    pieces = [row[0]["tool_calls"][0] for row in rows[2:-1]]
    assert len(pieces) >= 2 and all(set(p) == {"index", "function"} for p in pieces)
    assert json.loads("".join(p["function"]["arguments"] for p in pieces)) == {"city": "Paris"}
    assert rows[-1] == ({}, "tool_calls")
    assert fake.requests[0].json["tool_choice"] == {
        "type": "auto",
        "disable_parallel_tool_use": True,
    }


SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}}
JSON_SCHEMA = ResponseFormat("json_schema", JSONSchemaSpec("answer_schema", SCHEMA))


async def test_json_schema_is_a_forced_tool_seen_as_text(fake: FakeAnthropic, url: str) -> None:
    req = chat_request(response_format=JSON_SCHEMA)
    async with anthropic(url) as provider:
        result = await provider.chat(req, ctx("m-json"))
        chunks, error = await collect(provider.stream_chat(req, ctx("m-json")))
    choice = result.response.choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert json.loads(choice.message.content or "") == {"answer": 42}
    assert error is None and shape(chunks)[-1] == ({}, "stop")
    assert all(not c.choices or c.choices[0].delta.tool_calls is None for c in chunks)
    assert json.loads(text_of(chunks)) == {"answer": 42}
    sent = fake.requests[0].json
    assert sent["tool_choice"] == {
        "type": "tool",
        "name": "answer_schema",
        "disable_parallel_tool_use": True,
    }
    assert [(t["name"], t["input_schema"]) for t in sent["tools"]] == [("answer_schema", SCHEMA)]


async def test_json_object_mode(fake: FakeAnthropic, url: str) -> None:
    async with anthropic(url) as provider:
        result = await provider.chat(
            chat_request(response_format=ResponseFormat("json_object")), ctx("m-json")
        )
    assert json.loads(result.response.choices[0].message.content or "") == {"answer": 42}
    assert "JSON object" in fake.requests[0].json["system"]


async def test_images_are_sent_as_anthropic_image_blocks(fake: FakeAnthropic, url: str) -> None:
    parts = [
        TextPart("Describe"),
        ImagePart(ImageURL("data:image/jpeg;base64,/9j/4AAQ")),
        ImagePart(ImageURL("https://example.test/cat.png")),
    ]
    async with anthropic(url) as provider:
        await provider.chat(chat_request([Message("user", parts)]), ctx("m-ok"))
    assert fake.requests[0].json["messages"][0]["content"] == [
        {"type": "text", "text": "Describe"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"},
        },
        {"type": "image", "source": {"type": "url", "url": "https://example.test/cat.png"}},
    ]


async def test_inexpressible_request_fails_before_any_call(fake: FakeAnthropic, url: str) -> None:
    bad_call = ToolCall("t1", FunctionCall("f", "{not json"))
    async with anthropic(url) as provider:
        with pytest.raises(InvalidRequestError) as info:
            await provider.chat(chat_request(n=2), ctx("m-ok"))
        assert info.value.param == "n"
        with pytest.raises(InvalidRequestError) as info:
            await collect(
                provider.stream_chat(
                    chat_request([*HELLO, Message("assistant", tool_calls=[bad_call])]), ctx("m-ok")
                )
            )
        assert info.value.param == "messages"
    assert fake.requests == []


# ---------------------------------------------------------------- errors
ERROR_CASES = [
    ("m-rate-limited", UpstreamRateLimitedError, 429, "per-minute rate limit"),
    ("m-server-error", UpstreamServerError, 500, "Internal server error"),
    ("m-overloaded", UpstreamServerError, 529, "Overloaded"),
    ("m-bad-request", UpstreamBadRequestError, 400, "bad request from upstream"),
    ("m-unauthorized", UpstreamAuthError, 401, "invalid x-api-key"),
]


@pytest.mark.parametrize(("model", "cls", "status", "text"), ERROR_CASES)
@pytest.mark.parametrize("streaming", [False, True])
async def test_upstream_errors_map_to_provider_errors(
    url: str,
    fake: FakeAnthropic,
    model: str,
    cls: type[ProviderError],
    status: int,
    text: str,
    streaming: bool,
) -> None:
    async with anthropic(url) as provider:
        if streaming:
            chunks, error = await collect(provider.stream_chat(chat_request(), ctx(model)))
            assert chunks == []
        else:
            with pytest.raises(ProviderError) as info:
                await provider.chat(chat_request(), ctx(model))
            error = info.value
    assert type(error) is cls
    assert error.upstream_status == status and error.provider == "claude"
    assert text in error.message
    assert error.retry_after == (7.0 if status == 429 else None)


async def test_malformed_answers(url: str, fake: FakeAnthropic) -> None:
    async with anthropic(url) as provider:
        with pytest.raises(UpstreamMalformedError):
            await provider.chat(chat_request(), ctx("m-malformed"))
        chunks, error = await collect(provider.stream_chat(chat_request(), ctx("m-malformed")))
    assert chunks == [] and isinstance(error, UpstreamMalformedError)


async def test_connection_reset() -> None:
    with resetting_server() as reset_url:
        async with anthropic(reset_url) as provider:
            with pytest.raises(UpstreamServerError, match="connection failed"):
                await provider.chat(chat_request(), ctx("m-ok"))
            chunks, error = await collect(provider.stream_chat(chat_request(), ctx("m-ok")))
    assert chunks == [] and isinstance(error, UpstreamServerError)


async def test_timeout_closes_the_upstream_call(url: str, fake: FakeAnthropic) -> None:
    async with anthropic(url) as provider:
        with pytest.raises(UpstreamTimeoutError):
            await provider.chat(chat_request(), ctx("m-slow", total=0.3))
    assert await eventually(lambda: fake.disconnects == ["m-slow"])


async def test_stream_timeout_after_first_chunks(url: str, fake: FakeAnthropic) -> None:
    async with anthropic(url) as provider:
        chunks, error = await collect(
            provider.stream_chat(chat_request(), ctx("m-slow-stream", total=0.3))
        )
    assert shape(chunks) == [
        ({"role": "assistant", "content": ""}, None),
        ({"content": "Hello"}, None),
    ]
    assert isinstance(error, UpstreamTimeoutError)


@pytest.mark.parametrize(
    ("model", "cls", "text"),
    [
        ("m-truncated", UpstreamMalformedError, "before message_stop"),
        ("m-stream-error", UpstreamServerError, "overloaded_error): Overloaded"),
    ],
)
async def test_broken_stream_raises_after_the_chunks_already_sent(
    url: str,
    fake: FakeAnthropic,
    model: str,
    cls: type[ProviderError],
    text: str,
) -> None:
    async with anthropic(url) as provider:
        chunks, error = await collect(provider.stream_chat(chat_request(), ctx(model)))
        assert (await provider.chat(chat_request(), ctx(model))).response.choices[0]
    assert shape(chunks) == [
        ({"role": "assistant", "content": ""}, None),
        ({"content": "Hello"}, None),
    ]
    assert type(error) is cls and text in error.message


async def test_closing_the_stream_early_closes_the_upstream_connection(
    url: str,
    fake: FakeAnthropic,
) -> None:
    async with anthropic(url) as provider:
        stream = provider.stream_chat(chat_request(), ctx("m-slow-stream"))
        received = []
        async for part in stream:
            received.append(part.chunk)
            if len(received) == 2:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        # the fake waits 3 s for the rest and records the hang-up only if it comes first
        assert await eventually(lambda: fake.disconnects == ["m-slow-stream"], seconds=2.5)
    assert text_of(received) == "Hello"
