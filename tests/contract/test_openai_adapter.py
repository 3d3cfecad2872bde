"""OpenAIProvider against the fake OpenAI API over real HTTP (uvicorn + httpx): the same
scenarios as every other adapter's contract suite."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import anyio
import httpx
import msgspec
import pytest

from core.config import OpenAIProviderConfig
from core.errors import (
    ProviderError,
    UpstreamAuthError,
    UpstreamBadRequestError,
    UpstreamConnectError,
    UpstreamMalformedError,
    UpstreamRateLimitedError,
    UpstreamServerError,
    UpstreamTimeoutError,
)
from core.protocols import CallContext, Timeouts
from core.wire import ChatRequest, CompletionRequest, EmbeddingRequest, Message, StreamOptions
from providers.openai import OpenAIProvider
from providers.transport import make_client
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import free_port, resetting_server, serve

pytestmark = pytest.mark.anyio
HELLO = [Message("user", "Hi")]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeOpenAI, str]]:
    app = FakeOpenAI()
    with serve(app) as server:
        yield app, server.url


@pytest.fixture
def fake(served):
    served[0].requests.clear()
    return served[0]


@asynccontextmanager
async def openai_at(base_url: str, key: str | None = "sk-test") -> AsyncIterator[OpenAIProvider]:
    async with make_client() as client:
        yield OpenAIProvider("oa", client, OpenAIProviderConfig(base_url=base_url), key)


def ctx(model: str, raw: object | None = None, total: float = 10.0) -> CallContext:
    body = None if raw is None else json.dumps(raw).encode()
    return CallContext(
        request_id="req_1",
        upstream_model=model,
        raw_body=body,
        timeouts=Timeouts(total=total, first_token=total),
    )


async def test_chat_forwards_raw_body_and_keeps_upstream_bytes(served, fake):
    raw = {"model": "alias", "messages": [{"role": "user", "content": "Hi"}], "x_unknown": [1]}
    async with openai_at(served[1] + "/v1") as provider:
        result = await provider.chat(ChatRequest("alias", HELLO), ctx("m-ok", raw))
    assert result.response.choices[0].message.content == "Hello from openai!"
    assert json.loads(result.raw)["service_tier"] == "default"  # unknown to us, kept
    sent = fake.requests[-1]
    assert sent.json == {**raw, "model": "m-ok"}
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.path == "/v1/chat/completions"


async def test_chat_without_raw_body_encodes_the_request(served, fake):
    async with openai_at(served[1] + "/v1", key=None) as provider:
        await provider.chat(ChatRequest("alias", HELLO, temperature=0.5), ctx("m-ok"))
    assert fake.requests[-1].json["temperature"] == 0.5
    assert "authorization" not in fake.requests[-1].headers


async def test_stream_sequence_and_forced_usage(served, fake):
    req = ChatRequest("alias", HELLO, stream=True, stream_options=StreamOptions(include_usage=True))
    async with openai_at(served[1] + "/v1") as provider:
        parts = [
            p
            async for p in provider.stream_chat(
                req, ctx("m-cached", {"model": "a", "stream": True})
            )
        ]
    assert parts[0].chunk.choices[0].delta.role == "assistant"
    assert (
        "".join(p.chunk.choices[0].delta.content or "" for p in parts if p.chunk.choices)
        == "Hello from openai!"
    )
    assert parts[-1].chunk.usage.cached_tokens == 7
    assert all(msgspec.json.decode(p.raw)["id"] == "chatcmpl-fake123" for p in parts)
    assert fake.requests[-1].json["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("model", "error", "status"),
    [
        ("m-rate-limited", UpstreamRateLimitedError, 429),
        ("m-server-error", UpstreamServerError, 502),
        ("m-overloaded", UpstreamServerError, 502),
        ("m-bad-request", UpstreamBadRequestError, 400),
        ("m-unauthorized", UpstreamAuthError, 502),
        ("m-malformed", UpstreamMalformedError, 502),
    ],
)
async def test_error_mapping(served, model, error, status):
    async with openai_at(served[1] + "/v1") as provider:
        with pytest.raises(error) as info:
            await provider.chat(ChatRequest("alias", HELLO), ctx(model, {"model": "a"}))
    assert info.value.status == status and info.value.provider == "oa"
    if model == "m-rate-limited":
        assert info.value.retry_after == 7
    if model == "m-bad-request":
        assert info.value.message == "bad request from upstream"


@pytest.mark.parametrize(
    ("model", "error"),
    [
        ("m-malformed", UpstreamMalformedError),
        ("m-truncated", UpstreamMalformedError),
        ("m-stream-error", UpstreamServerError),
    ],
)
async def test_stream_failures_raise_from_the_generator(served, model, error):
    got = []
    async with openai_at(served[1] + "/v1") as provider:
        with pytest.raises(error):
            async for part in provider.stream_chat(
                ChatRequest("a", HELLO, stream=True), ctx(model, {"model": "a", "stream": True})
            ):
                got.append(part)
    assert (len(got) > 0) == (model != "m-malformed")


async def test_reset_and_refused_connections():
    with resetting_server() as url:
        async with openai_at(url + "/v1") as provider:
            with pytest.raises(UpstreamServerError):
                await provider.chat(ChatRequest("a", HELLO), ctx("m-ok", {"model": "a"}))
    async with openai_at(f"http://127.0.0.1:{free_port()}/v1") as provider:
        with pytest.raises(UpstreamConnectError) as info:
            await provider.chat(ChatRequest("a", HELLO), ctx("m-ok", {"model": "a"}))
    assert info.value.retryable and info.value.fallback_ok


async def test_timeout(served):
    served[0].slow_seconds = 2.0
    async with openai_at(served[1] + "/v1") as provider:
        with pytest.raises(UpstreamTimeoutError):
            await provider.chat(ChatRequest("a", HELLO), ctx("m-slow", {"model": "a"}, total=0.3))


async def test_closing_the_stream_disconnects_upstream(served):
    fake = served[0]
    fake.slow_seconds = 3.0
    before = fake.disconnects
    async with openai_at(served[1] + "/v1") as provider:
        stream = provider.stream_chat(
            ChatRequest("a", HELLO, stream=True),
            ctx("m-slow-stream", {"model": "a", "stream": True}),
        )
        assert (await anext(stream)).chunk.choices[0].delta.role == "assistant"
        await stream.aclose()
        with anyio.fail_after(3):
            while fake.disconnects == before:
                await anyio.sleep(0.02)
    assert fake.disconnects == before + 1


async def test_completions_and_embeddings(served, fake):
    async with openai_at(served[1] + "/v1") as provider:
        done = await provider.complete(
            CompletionRequest("a", "x"), ctx("m-ok", {"model": "a", "prompt": "x"})
        )
        assert (
            json.loads(done.body)["choices"][0]["text"] == " Paris."
            and done.usage.total_tokens == 16
        )
        parts = [
            p
            async for p in provider.stream_complete(
                CompletionRequest("a", "x", stream=True),
                ctx("m-ok", {"model": "a", "prompt": "x", "stream": True}),
            )
        ]
        assert parts[-1].usage is not None and not parts[-1].has_choices
        vectors = await provider.embed(
            EmbeddingRequest("a", ["p", "q"]), ctx("emb", {"model": "a", "input": ["p", "q"]})
        )
        assert len(json.loads(vectors.body)["data"]) == 2 and vectors.usage.prompt_tokens == 8


async def test_every_error_is_a_provider_error(served):
    async with openai_at(served[1] + "/v1") as provider:
        for model in ("m-server-error", "m-malformed", "m-unauthorized"):
            with pytest.raises(ProviderError):
                await provider.chat(ChatRequest("a", HELLO), ctx(model, {"model": "a"}))


@pytest.mark.parametrize("model", ["m-ok", "m-rate-limited", "m-malformed"])
async def test_plain_httpx_client_takes_the_same_path(served, model):
    """A client without the aiohttp fast path (any httpx client) behaves identically."""
    async with httpx.AsyncClient() as client:
        provider = OpenAIProvider(
            "oa", client, OpenAIProviderConfig(base_url=served[1] + "/v1"), "k"
        )
        call = provider.chat(ChatRequest("a", HELLO), ctx(model, {"model": "a"}))
        if model == "m-ok":
            assert (await call).response.choices[0].message.content == "Hello from openai!"
        else:
            with pytest.raises((UpstreamRateLimitedError, UpstreamMalformedError)) as info:
                await call
            assert info.value.provider == "oa"
