"""The OpenAI adapter's Responses passthrough against the fake OpenAI API over real HTTP:
the upstream gets the client's body as sent (only ``model`` replaced and ``store`` false),
the answer comes back byte for byte with a canonical reading of it for accounting, and
errors map to the same classes as the chat call (so fallback works alike)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest

from core.config import OpenAIProviderConfig, VllmProviderConfig
from core.errors import (
    UpstreamBadRequestError,
    UpstreamRateLimitedError,
    UpstreamServerError,
)
from core.protocols import CallContext, Timeouts
from providers.openai import OpenAIProvider
from providers.openai.responses import forward_body
from providers.transport import make_client
from tests.fixtures.fake_openai import RESPONSES_TEXT, FakeOpenAI
from tests.fixtures.server import serve

pytestmark = pytest.mark.anyio
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": False,
}
BODY = {
    "model": "alias",
    "instructions": "Be brief.",
    "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}],
    "tools": [TOOL],
    "reasoning": {"effort": "high", "summary": "auto"},
    "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}},
    "include": ["reasoning.encrypted_content"],
    "store": True,
    "x_unknown": {"kept": [1, 2.5, None]},
}


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeOpenAI, str]]:
    app = FakeOpenAI()
    with serve(app) as server:
        yield app, server.url


@asynccontextmanager
async def openai_at(base_url: str) -> AsyncIterator[OpenAIProvider]:
    async with make_client() as client:
        config = OpenAIProviderConfig(base_url=base_url, responses_api=True)
        yield OpenAIProvider("oa", client, config, "sk-test")


def ctx(model: str, body: dict[str, object]) -> CallContext:
    return CallContext(
        request_id="req_1",
        upstream_model=model,
        raw_body=json.dumps(body).encode(),
        timeouts=Timeouts(total=10.0, first_token=10.0),
    )


def test_forward_body_replaces_only_model_and_store() -> None:
    raw = b'{"model":"a","n":1e400,"input":"hi","tools":[{"type":"function","name":"f"}]}'
    sent = forward_body(raw, "gpt-x")
    assert sent == b'{"model":"gpt-x","n":1e400,"input":"hi",' + (
        b'"tools":[{"type":"function","name":"f"}],"store":false}'
    )


def test_responses_api_auto_is_openai_only() -> None:
    def speaks(config: OpenAIProviderConfig | VllmProviderConfig) -> bool:
        return OpenAIProvider("p", None, config, None).responses_api  # type: ignore[arg-type]

    assert speaks(OpenAIProviderConfig())
    assert speaks(OpenAIProviderConfig(base_url="https://api.openai.com/v1/"))
    assert not speaks(OpenAIProviderConfig(base_url="https://api.groq.com/openai/v1"))
    assert speaks(OpenAIProviderConfig(base_url="http://vllm:8000/v1", responses_api=True))
    assert not speaks(OpenAIProviderConfig(responses_api=False))
    assert not speaks(VllmProviderConfig())


async def test_call_forwards_the_body_and_keeps_the_answer(served) -> None:
    fake, url = served
    async with openai_at(url + "/v1") as provider:
        result = await provider.responses(ctx("m-ok", BODY))
    sent = fake.requests[-1]
    assert sent.path == "/v1/responses"
    assert sent.json == {**BODY, "model": "m-ok", "store": False}
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert json.loads(result.raw)["id"] == "resp_upstream123"
    message = result.response.choices[0].message
    assert message.content == RESPONSES_TEXT and result.response.choices[0].finish_reason == "stop"
    usage = result.response.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (13, 7, 20)
    assert (usage.cached_tokens, usage.reasoning_tokens) == (4, 2)


async def test_function_call_items_are_tool_calls(served) -> None:
    async with openai_at(served[1] + "/v1") as provider:
        result = await provider.responses(ctx("m-tool", BODY))
    choice = result.response.choices[0]
    (call,) = choice.message.tool_calls
    assert (call.id, call.function.name) == ("call_abc", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert choice.finish_reason == "tool_calls"


async def test_stream_forwards_every_event(served) -> None:
    fake, url = served
    async with openai_at(url + "/v1") as provider:
        parts = [p async for p in provider.stream_responses(ctx("m-ok", {**BODY, "stream": True}))]
    assert fake.requests[-1].json == {**BODY, "model": "m-ok", "store": False, "stream": True}
    kinds = [p.raw.split(b"\n", 1)[0] for p in parts]
    assert kinds[0] == b"event: response.created"
    assert kinds[-1] == b"event: response.completed"
    assert b"event: response.content_part.added" in kinds
    numbers = [json.loads(p.raw.split(b"data: ", 1)[1])["sequence_number"] for p in parts]
    assert numbers == list(range(len(parts)))
    text = "".join(c.delta.content or "" for p in parts for c in p.chunk.choices)
    assert text == RESPONSES_TEXT
    assert all(p.chunk.usage is None for p in parts[:-1])
    assert parts[-1].chunk.usage.prompt_tokens == 13
    assert parts[-1].chunk.id == "resp_upstream123"


async def test_stream_function_call_arrives_as_tool_call_deltas(served) -> None:
    async with openai_at(served[1] + "/v1") as provider:
        stream = provider.stream_responses(ctx("m-tool", {**BODY, "stream": True}))
        parts = [p async for p in stream]
    (choice,) = parts[-1].chunk.choices
    assert choice.finish_reason == "tool_calls"
    calls = [c for p in parts for ch in p.chunk.choices for c in ch.delta.tool_calls or []]
    assert (calls[0].id, calls[0].function.name) == ("call_abc", "get_weather")
    assert {c.index for c in calls} == {0}
    arguments = "".join(c.function.arguments or "" for c in calls)
    assert json.loads(arguments) == {"city": "Paris"}


@pytest.mark.parametrize(
    ("model", "error"),
    [
        ("m-rate-limited", UpstreamRateLimitedError),
        ("m-server-error", UpstreamServerError),
        ("m-bad-request", UpstreamBadRequestError),
    ],
)
async def test_errors_map_as_for_chat(served, model, error) -> None:
    async with openai_at(served[1] + "/v1") as provider:
        with pytest.raises(error):
            await provider.responses(ctx(model, BODY))
        with pytest.raises(error):
            async for _ in provider.stream_responses(ctx(model, {**BODY, "stream": True})):
                pass


async def test_an_error_event_mid_stream_raises_after_the_parts_before_it(served) -> None:
    got = []
    async with openai_at(served[1] + "/v1") as provider:
        with pytest.raises(UpstreamServerError):
            async for part in provider.stream_responses(
                ctx("m-stream-error", {**BODY, "stream": True})
            ):
                got.append(part)
    assert got[0].raw.startswith(b"event: response.created")
    assert got[-1].chunk.choices[0].delta.content == "Hello"
