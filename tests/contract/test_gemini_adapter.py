"""GeminiProvider against the fake Gemini over real HTTP (uvicorn on 127.0.0.1, real httpx)."""

from __future__ import annotations

import base64
import contextlib
import struct
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx
import msgspec
import pytest

from core.config import GeminiProviderConfig
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
from core.protocols import CallContext, EmbeddingProvider, Provider, Timeouts
from core.wire import ChatChunk, ChatRequest, EmbeddingRequest, EmbeddingResponse
from providers.gemini import GeminiProvider
from providers.transport import AiohttpTransport, make_client
from tests.fixtures.fake_gemini import API_KEY, JSON_TEXT, TEXT, FakeGemini, fake_vector
from tests.fixtures.server import resetting_server, serve

pytestmark = pytest.mark.anyio

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
WEATHER_SCHEMA_SENT = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
ROLE = ({"role": "assistant", "content": ""}, None)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeGemini, str]]:
    app = FakeGemini()
    with serve(app) as server:
        yield app, server.url


@pytest.fixture
def fake(served: tuple[FakeGemini, str]) -> FakeGemini:
    app = served[0]
    app.requests.clear()
    app.disconnects = 0
    app.slow_seconds = 3.0
    app.retry_after_header = True
    return app


@pytest.fixture
def url(served: tuple[FakeGemini, str], fake: FakeGemini) -> str:
    return served[1]


@contextlib.asynccontextmanager
async def provider(base_url: str, key: str | None = API_KEY) -> AsyncIterator[GeminiProvider]:
    config = GeminiProviderConfig(base_url=base_url, headers={"x-team": "blue"})
    async with make_client() as client:
        yield GeminiProvider("gemini", client, config, key)


def ctx(model: str, total: float = 10.0) -> CallContext:
    return CallContext(request_id="req1", upstream_model=model, timeouts=Timeouts(total=total))


def request(model: str = "m-ok", **fields: Any) -> ChatRequest:
    fields.setdefault("messages", [{"role": "user", "content": "hi"}])
    return msgspec.convert({"model": "alias", **fields}, ChatRequest)


async def collect(
    gen: AsyncIterator[Any],
) -> tuple[list[ChatChunk], ProviderError | InvalidRequestError | None]:
    chunks: list[ChatChunk] = []
    try:
        async for part in gen:
            chunks.append(part.chunk)
    except (ProviderError, InvalidRequestError) as exc:
        return chunks, exc
    return chunks, None


def deltas(chunks: list[ChatChunk]) -> list[Any]:
    return [
        (msgspec.to_builtins(c.choices[0].delta), c.choices[0].finish_reason)
        if c.choices
        else msgspec.to_builtins(c.usage)
        for c in chunks
    ]


# ---------------------------------------------------------------- chat
async def test_chat_sends_gemini_request_and_reads_answer(url: str, fake: FakeGemini) -> None:
    req = request(
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_tokens=20,
        temperature=0.2,
    )
    async with provider(url) as gemini:
        result = await gemini.chat(req, ctx("m-ok"))
    resp = result.response
    assert result.raw is None
    assert (resp.id, resp.model) == ("resp-1", "m-ok-001")
    assert resp.choices[0].message.content == TEXT
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens) == (
        11,
        5,
        16,
    )
    (sent,) = fake.requests
    assert (sent.method, sent.path, sent.query) == (
        "POST",
        "/v1beta/models/m-ok:generateContent",
        "",
    )
    assert sent.headers["x-goog-api-key"] == API_KEY
    assert sent.headers["x-team"] == "blue"
    assert sent.headers["content-type"] == "application/json"
    assert "key" not in sent.query and "authorization" not in sent.headers
    assert sent.json == {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "systemInstruction": {"parts": [{"text": "be brief"}]},
        "generationConfig": {"temperature": 0.2, "maxOutputTokens": 20},
    }


async def test_cached_usage_and_provider_protocols(url: str) -> None:
    async with provider(url) as gemini:
        assert isinstance(gemini, Provider) and isinstance(gemini, EmbeddingProvider)
        caps = gemini.capabilities
        assert caps.embeddings and caps.tools and caps.vision and caps.json_schema
        resp = (await gemini.chat(request(), ctx("m-cached"))).response
    assert resp.usage is not None and resp.usage.cached_tokens == 7


async def test_models_prefix_and_api_version_shape_the_url(url: str, fake: FakeGemini) -> None:
    config = GeminiProviderConfig(base_url=url + "/", api_version="v1")
    async with make_client() as client:
        gemini = GeminiProvider("gemini", client, config, API_KEY)
        await gemini.chat(request(), ctx("models/m-ok"))
    assert fake.requests[0].path == "/v1/models/m-ok:generateContent"


# ---------------------------------------------------------------- streaming
@pytest.mark.parametrize("include_usage", [False, True])
async def test_stream_yields_openai_chunk_sequence(
    url: str, fake: FakeGemini, include_usage: bool
) -> None:
    req = request(stream=True, stream_options={"include_usage": include_usage})
    async with provider(url) as gemini:
        chunks, error = await collect(gemini.stream_chat(req, ctx("m-ok")))
    assert error is None
    expected: list[Any] = [
        ROLE,
        ({"content": "Hello"}, None),
        ({"content": " from"}, None),
        ({"content": " gemini!"}, None),
        ({}, "stop"),
    ]
    if include_usage:
        expected.append({"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16})
    assert deltas(chunks) == expected
    assert {(c.id, c.model) for c in chunks} == {("resp-1", "m-ok-001")}
    (sent,) = fake.requests
    assert (sent.path, sent.query) == ("/v1beta/models/m-ok:streamGenerateContent", "alt=sse")
    assert sent.headers["x-goog-api-key"] == API_KEY


async def test_stream_tool_call(url: str) -> None:
    req = request(stream=True, tools=[WEATHER])
    async with provider(url) as gemini:
        chunks, error = await collect(gemini.stream_chat(req, ctx("m-tool")))
    assert error is None
    header = {
        "index": 0,
        "id": "call_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    arguments = {"index": 0, "function": {"arguments": '{"city":"Paris"}'}}
    assert deltas(chunks) == [
        ROLE,
        ({"tool_calls": [header]}, None),
        ({"tool_calls": [arguments]}, None),
        ({}, "tool_calls"),
    ]


async def test_truncated_stream_raises_after_its_chunks(url: str) -> None:
    async with provider(url) as gemini:
        chunks, error = await collect(gemini.stream_chat(request(stream=True), ctx("m-truncated")))
    assert deltas(chunks) == [ROLE, ({"content": "Hello"}, None)]
    assert isinstance(error, UpstreamMalformedError) and error.provider == "gemini"


async def test_mid_stream_error_is_mapped_after_its_chunks(url: str) -> None:
    async with provider(url) as gemini:
        gen = gemini.stream_chat(request(stream=True), ctx("m-stream-error"))
        chunks, error = await collect(gen)
    assert deltas(chunks) == [ROLE, ({"content": "Hello"}, None)]
    assert isinstance(error, UpstreamServerError)
    assert error.upstream_status == 500 and "internal error" in error.message


async def test_malformed_stream_event(url: str) -> None:
    async with provider(url) as gemini:
        chunks, error = await collect(gemini.stream_chat(request(stream=True), ctx("m-malformed")))
    assert chunks == [] and isinstance(error, UpstreamMalformedError)


async def test_closing_the_stream_early_closes_the_upstream_connection(
    url: str, fake: FakeGemini
) -> None:
    fake.slow_seconds = 5.0
    opened: list[httpx.Response] = []

    async def remember(response: httpx.Response) -> None:
        opened.append(response)

    config = GeminiProviderConfig(base_url=url)
    async with httpx.AsyncClient(
        transport=AiohttpTransport(), event_hooks={"response": [remember]}
    ) as client:
        gemini = GeminiProvider("gemini", client, config, API_KEY)
        gen = gemini.stream_chat(request(stream=True), ctx("m-slow-stream"))
        seen = []
        async for part in gen:
            seen.append(part.chunk)
            if part.chunk.choices[0].delta.content:
                break
        await gen.aclose()  # type: ignore[attr-defined]
        # Closed by the generator itself, not later by garbage collection.
        assert [r.is_closed for r in opened] == [True]
        with anyio.fail_after(3):
            while fake.disconnects == 0:
                await anyio.sleep(0.02)
    assert deltas(seen) == [ROLE, ({"content": "Hello"}, None)]


async def test_slow_stream_times_out_after_first_chunks(url: str, fake: FakeGemini) -> None:
    async with provider(url) as gemini:
        gen = gemini.stream_chat(request(stream=True), ctx("m-slow-stream", total=0.5))
        chunks, error = await collect(gen)
    assert len(chunks) == 2 and isinstance(error, UpstreamTimeoutError)


# ---------------------------------------------------------------- tools, json, images
async def test_tool_call_and_tool_result_turn(url: str, fake: FakeGemini) -> None:
    async with provider(url) as gemini:
        first = (await gemini.chat(request(tools=[WEATHER]), ctx("m-tool"))).response
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        (call,) = choice.message.tool_calls
        assert (call.id, call.function.name) == ("call_0", "get_weather")
        assert msgspec.json.decode(call.function.arguments) == {"city": "Paris"}
        history = [
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "tool_calls": [msgspec.to_builtins(call) | {"type": "function"}]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'},
        ]
        req = request(messages=history, tools=[WEATHER], tool_choice="auto")
        second = (await gemini.chat(req, ctx("m-ok"))).response
    assert second.choices[0].message.content == TEXT
    declaration = {"name": "get_weather", "parameters": WEATHER_SCHEMA_SENT}
    assert fake.requests[0].json["tools"] == [{"functionDeclarations": [declaration]}]
    sent = fake.requests[1].json
    assert sent["toolConfig"] == {"functionCallingConfig": {"mode": "AUTO"}}
    assert sent["contents"] == [
        {"role": "user", "parts": [{"text": "weather in Paris?"}]},
        {
            "role": "model",
            "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}],
        },
        {
            "role": "user",
            "parts": [{"functionResponse": {"name": "get_weather", "response": {"temp_c": 21}}}],
        },
    ]


@pytest.mark.parametrize(
    ("fmt", "config"),
    [
        ({"type": "json_object"}, {"responseMimeType": "application/json"}),
        (
            {
                "type": "json_schema",
                "json_schema": {
                    "name": "answer",
                    "strict": True,
                    "schema": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"answer": {"type": "integer"}},
                    },
                },
            },
            {
                "responseMimeType": "application/json",
                "responseSchema": {"type": "object", "properties": {"answer": {"type": "integer"}}},
            },
        ),
    ],
)
async def test_json_modes(
    url: str, fake: FakeGemini, fmt: dict[str, Any], config: dict[str, Any]
) -> None:
    async with provider(url) as gemini:
        resp = (await gemini.chat(request(response_format=fmt), ctx("m-json"))).response
    assert resp.choices[0].message.content == JSON_TEXT
    assert fake.requests[0].json["generationConfig"] == config


async def test_images_are_sent_inline_or_by_uri(url: str, fake: FakeGemini) -> None:
    content = [
        {"type": "text", "text": "compare"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.gif"}},
    ]
    async with provider(url) as gemini:
        await gemini.chat(request(messages=[{"role": "user", "content": content}]), ctx("m-ok"))
    assert fake.requests[0].json["contents"][0]["parts"] == [
        {"text": "compare"},
        {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
        {"fileData": {"mimeType": "image/gif", "fileUri": "https://example.com/cat.gif"}},
    ]


# ---------------------------------------------------------------- errors
ERROR_CASES = [
    ("m-rate-limited", UpstreamRateLimitedError, 429, "Resource has been exhausted"),
    ("m-server-error", UpstreamServerError, 500, "An internal error has occurred."),
    ("m-overloaded", UpstreamServerError, 503, "The model is overloaded."),
    ("m-bad-request", UpstreamBadRequestError, 400, "bad request from upstream"),
    ("m-unauthorized", UpstreamAuthError, 401, "invalid authentication credentials"),
]


@pytest.mark.parametrize(("model", "kind", "status", "message"), ERROR_CASES)
@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_errors_map_to_provider_errors(
    url: str, model: str, kind: type[ProviderError], status: int, message: str, stream: bool
) -> None:
    async with provider(url) as gemini:
        if stream:
            chunks, error = await collect(gemini.stream_chat(request(stream=True), ctx(model)))
            assert chunks == []
        else:
            with pytest.raises(ProviderError) as info:
                await gemini.chat(request(), ctx(model))
            error = info.value
    assert type(error) is kind
    assert error.upstream_status == status and error.provider == "gemini"
    assert message in error.message
    assert error.retry_after == (7 if status == 429 else None)


async def test_retry_delay_comes_from_retry_info_without_header(url: str, fake: FakeGemini) -> None:
    fake.retry_after_header = False
    async with provider(url) as gemini:
        with pytest.raises(UpstreamRateLimitedError) as info:
            await gemini.chat(request(), ctx("m-rate-limited"))
    assert info.value.retry_after == 7.0


@pytest.mark.parametrize(("key", "status"), [("wrong-key", 400), (None, 403)])
async def test_refused_credentials_are_auth_errors(url: str, key: str | None, status: int) -> None:
    async with provider(url, key=key) as gemini:
        with pytest.raises(UpstreamAuthError) as info:
            await gemini.chat(request(), ctx("m-ok"))
    assert info.value.upstream_status == status


async def test_malformed_body(url: str) -> None:
    async with provider(url) as gemini:
        with pytest.raises(UpstreamMalformedError):
            await gemini.chat(request(), ctx("m-malformed"))


async def test_timeout(url: str, fake: FakeGemini) -> None:
    fake.slow_seconds = 2.0
    async with provider(url) as gemini:
        started = time.monotonic()
        with pytest.raises(UpstreamTimeoutError):
            await gemini.chat(request(), ctx("m-slow", total=0.3))
    assert time.monotonic() - started < 1.5


async def test_connection_reset() -> None:
    with resetting_server() as reset_url:
        async with provider(reset_url) as gemini:
            with pytest.raises(UpstreamServerError) as info:
                await gemini.chat(request(), ctx("m-ok"))
            chunks, error = await collect(gemini.stream_chat(request(stream=True), ctx("m-ok")))
    assert "connection failed" in info.value.message
    assert chunks == [] and isinstance(error, UpstreamServerError)


async def test_unexpressible_request_is_rejected_before_any_call(
    url: str, fake: FakeGemini
) -> None:
    req = request(messages=[{"role": "tool", "tool_call_id": "nope", "content": "1"}])
    async with provider(url) as gemini:
        with pytest.raises(InvalidRequestError):
            await gemini.chat(req, ctx("m-ok"))
        _, error = await collect(gemini.stream_chat(req, ctx("m-ok")))
    assert isinstance(error, InvalidRequestError) and fake.requests == []


# ---------------------------------------------------------------- embeddings
async def test_single_embedding(url: str, fake: FakeGemini) -> None:
    req = EmbeddingRequest(model="alias", input="hello", dimensions=4)
    async with provider(url) as gemini:
        result = await gemini.embed(req, ctx("m-embed"))
    body = msgspec.json.decode(result.body, type=EmbeddingResponse)
    assert [item.embedding for item in body.data] == [fake_vector("hello", 4)]
    assert (body.model, body.usage.prompt_tokens) == ("m-embed", 0)
    (sent,) = fake.requests
    assert sent.path == "/v1beta/models/m-embed:embedContent"
    assert sent.headers["x-goog-api-key"] == API_KEY
    assert sent.json == {"content": {"parts": [{"text": "hello"}]}, "outputDimensionality": 4}


async def test_batch_embeddings_in_base64(url: str, fake: FakeGemini) -> None:
    req = EmbeddingRequest(model="alias", input=["a", "b"], encoding_format="base64")
    async with provider(url) as gemini:
        result = await gemini.embed(req, ctx("m-embed"))
    body = msgspec.json.decode(result.body, type=EmbeddingResponse)
    decoded = [
        list(struct.unpack("<8f", base64.b64decode(str(item.embedding)))) for item in body.data
    ]
    expected = [fake_vector("a"), fake_vector("b")]
    assert decoded == expected  # k/128 values are exact in float32
    (sent,) = fake.requests
    assert sent.path == "/v1beta/models/m-embed:batchEmbedContents"
    assert sent.json == {
        "requests": [
            {"model": "models/m-embed", "content": {"parts": [{"text": "a"}]}},
            {"model": "models/m-embed", "content": {"parts": [{"text": "b"}]}},
        ]
    }


async def test_embedding_token_ids_and_errors(url: str, fake: FakeGemini) -> None:
    async with provider(url) as gemini:
        with pytest.raises(InvalidRequestError) as info:
            await gemini.embed(EmbeddingRequest(model="a", input=[1, 2, 3]), ctx("m-embed"))
        assert info.value.param == "input" and fake.requests == []
        with pytest.raises(UpstreamRateLimitedError):
            await gemini.embed(EmbeddingRequest(model="a", input="x"), ctx("m-rate-limited"))
