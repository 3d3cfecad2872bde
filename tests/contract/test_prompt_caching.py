"""Provider prompt caching over real HTTP against the vendor fakes: Anthropic gets
``cache_control`` breakpoints and reports cache reads as cached tokens; OpenAI-compatible
upstreams get the tenant's ``prompt_cache_key``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from core.config import AnthropicProviderConfig, OpenAIProviderConfig, VllmProviderConfig
from core.protocols import CallContext, Timeouts
from core.wire import ChatRequest, EmbeddingRequest, FunctionDef, Message, StreamOptions, Tool
from providers.anthropic import AnthropicProvider
from providers.openai import OpenAIProvider
from providers.transport import make_client
from tests.fixtures.fake_anthropic import FakeAnthropic
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve

pytestmark = pytest.mark.anyio

EPHEMERAL = {"type": "ephemeral"}
SYSTEM = "You answer questions about the attached handbook. " * 100  # ~5,000 characters
SEARCH = Tool(
    FunctionDef(
        "search",
        "Search the handbook. " * 250,
        {"type": "object", "properties": {"q": {"type": "string"}}},
    )
)


@pytest.fixture(scope="module")
def anthropic_fake() -> Iterator[tuple[FakeAnthropic, str]]:
    app = FakeAnthropic()
    with serve(app) as server:
        yield app, server.url


@pytest.fixture(scope="module")
def openai_fake() -> Iterator[tuple[FakeOpenAI, str]]:
    app = FakeOpenAI()
    with serve(app) as server:
        yield app, server.url


@asynccontextmanager
async def claude(url: str) -> AsyncIterator[AnthropicProvider]:
    async with make_client() as client:
        yield AnthropicProvider("claude", client, AnthropicProviderConfig(base_url=url), "sk-ant")


@asynccontextmanager
async def openai(url: str, vllm: bool = False) -> AsyncIterator[OpenAIProvider]:
    kind = VllmProviderConfig if vllm else OpenAIProviderConfig
    async with make_client() as client:
        yield OpenAIProvider("oa", client, kind(base_url=url + "/v1"), "sk-test")


def ctx(model: str, raw: Any = None, **extra: Any) -> CallContext:
    body = None if raw is None else json.dumps(raw).encode()
    return CallContext(
        request_id="req-1",
        upstream_model=model,
        raw_body=body,
        timeouts=Timeouts(total=10.0, first_token=10.0),
        tenant="acme",
        **extra,
    )


def handbook_request(**options: Any) -> ChatRequest:
    return ChatRequest(
        model="alias",
        messages=[Message("system", SYSTEM), Message("user", "Where is the fire exit?")],
        **options,
    )


# ---------------------------------------------------------------- Anthropic
async def test_anthropic_long_prefix_gets_breakpoints_and_reports_cache_reads(anthropic_fake):
    fake, url = anthropic_fake
    fake.requests.clear()
    async with claude(url) as provider:
        result = await provider.chat(
            handbook_request(tools=[SEARCH]), ctx("m-cached", cache_control_min_chars=4096)
        )
    sent = fake.requests[-1].json
    assert sent["system"] == [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}]
    assert sent["tools"][-1]["cache_control"] == EPHEMERAL
    assert sent["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Where is the fire exit?"}]}
    ]
    usage = result.response.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    # The fake answers input 2 + cache write 2 + cache read 7.
    assert (usage.prompt_tokens, usage.cached_tokens) == (11, 7)
    assert usage.prompt_tokens_details.cache_creation_tokens == 2


async def test_anthropic_stream_reports_cache_reads_too(anthropic_fake):
    fake, url = anthropic_fake
    req = handbook_request(stream=True, stream_options=StreamOptions(include_usage=True))
    async with claude(url) as provider:
        parts = [
            p
            async for p in provider.stream_chat(req, ctx("m-cached", cache_control_min_chars=4096))
        ]
    assert fake.requests[-1].json["system"][0]["cache_control"] == EPHEMERAL
    usage = parts[-1].chunk.usage
    assert usage is not None and usage.cached_tokens == 7 and usage.prompt_tokens == 11


async def test_anthropic_without_the_setting_or_below_it_sends_no_breakpoint(anthropic_fake):
    fake, url = anthropic_fake
    async with claude(url) as provider:
        await provider.chat(handbook_request(), ctx("m-ok"))
        plain = fake.requests[-1].json
        await provider.chat(handbook_request(), ctx("m-ok", cache_control_min_chars=50_000))
        short = fake.requests[-1].json
    assert plain["system"] == SYSTEM == short["system"]
    assert "cache_control" not in json.dumps(plain) + json.dumps(short)


async def test_anthropic_forwards_the_clients_own_marks_instead(anthropic_fake):
    fake, url = anthropic_fake
    raw = {
        "model": "alias",
        "messages": [
            {"role": "system", "content": SYSTEM},
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "Where is the fire exit?",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ],
    }
    async with claude(url) as provider:
        answer = await provider.chat(
            handbook_request(), ctx("m-ok", raw, cache_control_min_chars=4096)
        )
    sent = fake.requests[-1].json
    assert sent["system"] == SYSTEM  # no automatic mark next to the client's
    assert sent["messages"][0]["content"][0]["cache_control"] == EPHEMERAL
    assert answer.response.choices[0].message.content == "Hello from anthropic!"


# ---------------------------------------------------------------- OpenAI-compatible
async def test_openai_gets_the_tenants_prompt_cache_key(openai_fake):
    fake, url = openai_fake
    raw = {"model": "alias", "messages": [{"role": "user", "content": "Hi"}]}
    async with openai(url) as provider:
        result = await provider.chat(
            ChatRequest("alias", [Message("user", "Hi")]),
            ctx("m-cached", raw, prompt_cache_key="acme"),
        )
    assert fake.requests[-1].json == {**raw, "model": "m-cached", "prompt_cache_key": "acme"}
    assert result.response.usage is not None and result.response.usage.cached_tokens == 7


async def test_openai_stream_gets_the_key_and_the_clients_own_key_wins(openai_fake):
    fake, url = openai_fake
    req = ChatRequest("alias", [Message("user", "Hi")], stream=True)
    own = {
        "model": "alias",
        "stream": True,
        "messages": [{"role": "user", "content": "Hi"}],
        "prompt_cache_key": "client-chose",
    }
    async with openai(url) as provider:
        parts = [
            p
            async for p in provider.stream_chat(
                req,
                ctx(
                    "m-cached",
                    {k: v for k, v in own.items() if k != "prompt_cache_key"},
                    prompt_cache_key="acme",
                ),
            )
        ]
        assert fake.requests[-1].json["prompt_cache_key"] == "acme"
        assert parts[-1].chunk.usage is not None and parts[-1].chunk.usage.cached_tokens == 7
        _ = [p async for p in provider.stream_chat(req, ctx("m-ok", own, prompt_cache_key="acme"))]
        assert fake.requests[-1].json["prompt_cache_key"] == "client-chose"


async def test_openai_without_a_key_and_embeddings_send_none(openai_fake):
    fake, url = openai_fake
    raw = {"model": "alias", "messages": [{"role": "user", "content": "Hi"}]}
    async with openai(url) as provider:
        await provider.chat(ChatRequest("alias", [Message("user", "Hi")]), ctx("m-ok", raw))
        assert "prompt_cache_key" not in fake.requests[-1].json
        await provider.embed(
            EmbeddingRequest("alias", "Hi"),
            ctx("m-ok", {"model": "alias", "input": "Hi"}, prompt_cache_key="acme"),
        )
        assert "prompt_cache_key" not in fake.requests[-1].json


async def test_local_workers_never_get_the_key(openai_fake):
    fake, url = openai_fake
    raw = {"model": "alias", "messages": [{"role": "user", "content": "Hi"}]}
    async with openai(url, vllm=True) as provider:
        await provider.chat(
            ChatRequest("alias", [Message("user", "Hi")]), ctx("m-ok", raw, prompt_cache_key="acme")
        )
    assert fake.requests[-1].json == {**raw, "model": "m-ok"}
