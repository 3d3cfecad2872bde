"""The Messages passthrough (providers/anthropic/passthrough.py) against the fake Anthropic
API over real HTTP: the client's body reaches Anthropic with only ``model`` replaced, the
answer comes back as Anthropic's own bytes next to its canonical form, errors map as for the
translated call."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest

from core.config import AnthropicProviderConfig
from core.errors import (
    ProviderError,
    UpstreamBadRequestError,
    UpstreamMalformedError,
    UpstreamRateLimitedError,
    UpstreamServerError,
)
from core.protocols import CallContext, Timeouts
from core.wire import StreamPart
from providers.anthropic import AnthropicProvider, passthrough
from providers.transport import make_client
from tests.fixtures.fake_anthropic import SIGNATURE, FakeAnthropic, sse
from tests.fixtures.server import serve

pytestmark = pytest.mark.anyio

FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
WEATHER = {
    "name": "get_weather",
    "description": "Weather by city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    "cache_control": {"type": "ephemeral"},
}


def claude_code_body(**extra: Any) -> dict[str, Any]:
    """A Claude Code style turn: cached system blocks and tools, a signed thinking block in
    history, and a field no version of this gateway knows."""
    return {
        "model": "claude-alias",
        "max_tokens": 4096,
        "system": [
            {
                "type": "text",
                "text": "You are a coding agent.",
                "cache_control": {"type": "ephemeral"},
            },
            {
                "type": "text",
                "text": "Be brief.",
                "cache_control": {"type": "ephemeral", "ttl": "1h"},
            },
        ],
        "tools": [WEATHER],
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Call the tool.", "signature": SIGNATURE},
                    {"type": "text", "text": "Looking."},
                ],
            },
            {"role": "user", "content": [{"type": "text", "text": "And now?"}]},
        ],
        "future_field": {"nested": [1, 2.50, "x"]},
        **extra,
    }


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeAnthropic, str]]:
    app = FakeAnthropic(slow_seconds=3.0)
    with serve(app) as server:
        yield app, server.url


@pytest.fixture
def fake(served: tuple[FakeAnthropic, str]) -> FakeAnthropic:
    served[0].requests.clear()
    return served[0]


@asynccontextmanager
async def provider(
    base_url: str, headers: dict[str, str] | None = None
) -> AsyncIterator[AnthropicProvider]:
    async with make_client() as client:
        cfg = AnthropicProviderConfig(
            base_url=base_url, anthropic_version="2023-06-01", headers=headers or {}
        )
        yield AnthropicProvider("claude", client, cfg, "sk-ant-test")


def ctx(model: str) -> CallContext:
    return CallContext(
        request_id="req-1", upstream_model=model, timeouts=Timeouts(connect=5.0, total=30.0)
    )


def assert_same_but_model(sent: bytes, received: bytes, model: str) -> None:
    """Every top-level field byte-for-byte the client's, except ``model``."""
    client, upstream = FIELDS.decode(sent), FIELDS.decode(received)
    assert bytes(upstream.pop("model")) == json.dumps(model).encode()
    client.pop("model")
    assert {k: bytes(v) for k, v in upstream.items()} == {k: bytes(v) for k, v in client.items()}


# ---------------------------------------------------------------- the body
def test_rewrite_body_changes_only_the_model() -> None:
    raw = msgspec.json.encode(claude_code_body())
    expected = raw.replace(b'"model":"claude-alias"', b'"model":"m-ok"')
    assert passthrough.rewrite_body(raw, "m-ok") == expected


def test_rewrite_body_drops_only_unsigned_thinking() -> None:
    body = claude_code_body()
    body["messages"][1]["content"].insert(0, {"type": "thinking", "thinking": "?", "signature": ""})
    body["messages"].append({"role": "assistant", "content": "thinking about it"})
    rewritten = json.loads(passthrough.rewrite_body(json.dumps(body).encode(), "m-ok"))
    assert rewritten["messages"][1]["content"] == claude_code_body()["messages"][1]["content"]
    assert rewritten["messages"][3] == {"role": "assistant", "content": "thinking about it"}


def test_merged_beta_keeps_each_feature_once() -> None:
    assert passthrough.merged_beta(None, "a,b") == "a,b"
    assert passthrough.merged_beta("a", " b , a") == "a,b"
    assert passthrough.merged_beta(None, None) is None


def test_event_with_model_rewrites_message_start_only() -> None:
    start = sse("message_start", {"type": "message_start", "message": {"id": "m", "model": "x"}})
    out = passthrough.event_with_model(start, "alias")
    assert out.startswith(b"event: message_start\ndata: ") and out.endswith(b"\n\n")
    assert json.loads(out.split(b"data: ", 1)[1])["message"] == {"id": "m", "model": "alias"}
    ping = sse("ping", {"type": "ping"})
    assert passthrough.event_with_model(ping, "alias") == ping


# ---------------------------------------------------------------- calls
async def test_call_sends_the_clients_body_and_headers(fake: FakeAnthropic, served: Any) -> None:
    raw = json.dumps(claude_code_body()).encode()
    async with provider(served[1], {"anthropic-beta": "configured-1"}) as claude:
        result = await passthrough.call(claude, raw, ctx("m-ok"), "prompt-caching-2024-07-31")
    (recorded,) = fake.requests
    assert_same_but_model(raw, recorded.body, "m-ok")
    assert recorded.headers["x-api-key"] == "sk-ant-test"
    assert recorded.headers["anthropic-version"] == "2023-06-01"
    assert recorded.headers["anthropic-beta"] == "configured-1,prompt-caching-2024-07-31"
    answer = json.loads(result.raw or b"")
    assert answer["content"][0] == {
        "type": "thinking",
        "thinking": answer["content"][0]["thinking"],
        "signature": SIGNATURE,
    }
    usage = result.response.usage
    assert usage is not None and usage.prompt_tokens == 11
    assert usage.completion_tokens == answer["usage"]["output_tokens"]


async def test_call_without_beta_sends_none(fake: FakeAnthropic, served: Any) -> None:
    async with provider(served[1]) as claude:
        await passthrough.call(claude, json.dumps(claude_code_body()).encode(), ctx("m-ok"))
    assert "anthropic-beta" not in fake.requests[0].headers


@pytest.mark.parametrize(
    ("model", "error"),
    [
        ("m-rate-limited", UpstreamRateLimitedError),
        ("m-server-error", UpstreamServerError),
        ("m-overloaded", UpstreamServerError),
        ("m-bad-request", UpstreamBadRequestError),
        ("m-malformed", UpstreamMalformedError),
    ],
)
@pytest.mark.parametrize("streamed", [False, True])
async def test_errors_map_as_for_the_translated_call(
    fake: FakeAnthropic, served: Any, model: str, error: type[ProviderError], streamed: bool
) -> None:
    raw = json.dumps(claude_code_body(stream=streamed)).encode()
    async with provider(served[1]) as claude:
        with pytest.raises(error) as raised:
            if streamed:
                await collect(passthrough.stream(claude, raw, ctx(model)))
            else:
                await passthrough.call(claude, raw, ctx(model))
    if model == "m-rate-limited":
        assert raised.value.retry_after == 7


async def collect(parts: AsyncIterator[StreamPart]) -> list[StreamPart]:
    return [part async for part in parts]


async def test_stream_forwards_every_event_as_sent(fake: FakeAnthropic, served: Any) -> None:
    raw = json.dumps(claude_code_body(stream=True, tools=[WEATHER])).encode()
    async with provider(served[1]) as claude:
        parts = await collect(passthrough.stream(claude, raw, ctx("m-tool"), "beta-x"))
    assert_same_but_model(raw, fake.requests[0].body, "m-tool")
    assert fake.requests[0].headers["anthropic-beta"] == "beta-x"
    names = [part.raw.split(b"\n", 1)[0] for part in parts if part.raw]
    assert len(names) == len(parts) and names[0] == b"event: message_start"
    assert names[-1] == b"event: message_stop" and b"event: ping" in names
    for part in parts:  # each as the fake framed it
        assert part.raw is not None
        name, data = part.raw.decode().removesuffix("\n\n").split("\n")
        assert part.raw == sse(name.removeprefix("event: "), json.loads(data[6:]))
    assert parts[-1].chunk.usage is not None
    assert parts[-1].chunk.usage.prompt_tokens == 11
    assert parts[-1].chunk.usage.completion_tokens == 30  # 5 + the thinking tokens
    calls = [c for p in parts for ch in p.chunk.choices for c in ch.delta.tool_calls or ()]
    assert calls[0].function is not None and calls[0].function.name == "get_weather"


@pytest.mark.parametrize(
    ("model", "error"),
    [("m-stream-error", UpstreamServerError), ("m-truncated", UpstreamMalformedError)],
)
async def test_stream_failures_after_the_start(
    fake: FakeAnthropic, served: Any, model: str, error: type[ProviderError]
) -> None:
    raw = json.dumps(claude_code_body(stream=True)).encode()
    seen: list[StreamPart] = []
    async with provider(served[1]) as claude:
        with pytest.raises(error):
            async for part in passthrough.stream(claude, raw, ctx(model)):
                seen.append(part)
    assert seen and seen[0].raw is not None and seen[0].raw.startswith(b"event: message_start")
