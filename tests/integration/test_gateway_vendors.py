"""End to end for the converting providers: the openai SDK talks OpenAI to the gateway, the
gateway talks Anthropic's and Gemini's own wire formats to fakes of them."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.fixtures.fake_anthropic import FakeAnthropic
from tests.fixtures.fake_gemini import API_KEY as GEMINI_KEY
from tests.fixtures.fake_gemini import FakeGemini
from tests.fixtures.server import serve
from tests.integration.gateway_harness import running_gateway

pytestmark = pytest.mark.anyio
USER = [{"role": "user", "content": "Say hello"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
VENDORS = ["anthropic", "gemini"]


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict]:
    anthropic, gemini = FakeAnthropic(), FakeGemini()
    with serve(anthropic) as an_server, serve(gemini) as ge_server:
        yield {"anthropic": (anthropic, an_server.url), "gemini": (gemini, ge_server.url)}


@pytest.fixture(scope="module")
def gateway(fakes):
    an_url, ge_url = fakes["anthropic"][1], fakes["gemini"][1]
    lines = [
        "providers:",
        f"  anthropic: {{type: anthropic, base_url: '{an_url}', api_key_env: AN_KEY}}",
        f"  gemini: {{type: gemini, base_url: '{ge_url}', api_key_env: GE_KEY}}",
        "models:",
    ]
    for vendor in VENDORS:
        for scenario in ("ok", "tool", "json", "cached", "server-error", "stream-error"):
            lines.append(
                f"  {vendor}-{scenario}: {{targets: [{{provider: {vendor}, model: m-{scenario}}}]}}"
            )
        lines.append(
            f"  {vendor}-fallback: {{targets: [{{provider: {vendor}, model: m-overloaded}}, "
            f"{{provider: {vendor}, model: m-ok}}]}}"
        )
    lines.append("  ge-embed: {targets: [{provider: gemini, model: text-embedding-004}]}")
    env = {"AN_KEY": "sk-ant-test", "GE_KEY": GEMINI_KEY}
    with running_gateway("\n".join(lines), env) as gw:
        yield gw


@pytest.fixture
def client(gateway):
    return openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)


@pytest.mark.parametrize("vendor", VENDORS)
def test_chat(client, gateway, vendor):
    raw = client.chat.completions.with_raw_response.create(model=f"{vendor}-ok", messages=USER)
    completion = raw.parse()
    assert completion.choices[0].message.content == f"Hello from {vendor}!"
    assert completion.usage.prompt_tokens == 11 and completion.usage.completion_tokens == 5
    assert raw.headers["x-switchyard-provider"] == vendor
    wire = json.loads(raw.http_response.content)
    assert wire["object"] == "chat.completion"
    assert wire["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("vendor", VENDORS)
async def test_stream_async_with_usage(gateway, vendor):
    aclient = openai.AsyncOpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    stream = await aclient.chat.completions.create(
        model=f"{vendor}-cached", messages=USER, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == f"Hello from {vendor}!"
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens_details.cached_tokens == 7
    await aclient.close()


@pytest.mark.parametrize("vendor", VENDORS)
def test_stream_without_usage_has_no_usage_chunk(client, vendor):
    chunks = list(client.chat.completions.create(model=f"{vendor}-ok", messages=USER, stream=True))
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("vendor", VENDORS)
def test_tool_call_and_tool_result_turn(client, fakes, vendor):
    first = client.chat.completions.create(model=f"{vendor}-tool", messages=USER, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert first.choices[0].finish_reason == "tool_calls"
    turn = [
        *USER,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'},
    ]
    second = client.chat.completions.create(model=f"{vendor}-ok", messages=turn, tools=TOOLS)
    assert second.choices[0].message.content == f"Hello from {vendor}!"
    sent = fakes[vendor][0].requests[-1].json
    if vendor == "anthropic":
        assert sent["messages"][-1]["content"][0]["type"] == "tool_result"
        assert sent["messages"][-1]["content"][0]["tool_use_id"] == call.id
    else:
        response = sent["contents"][-1]["parts"][0]["functionResponse"]
        assert response == {"name": "get_weather", "response": {"temp": 21}}


@pytest.mark.parametrize("vendor", VENDORS)
def test_streamed_tool_call(client, vendor):
    chunks = list(
        client.chat.completions.create(
            model=f"{vendor}-tool", messages=USER, tools=TOOLS, stream=True
        )
    )
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather" and deltas[0].id
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"city": "Paris"}


@pytest.mark.parametrize("vendor", VENDORS)
def test_json_schema(client, vendor):
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
    }
    completion = client.chat.completions.create(
        model=f"{vendor}-json",
        messages=USER,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema},
        },
    )
    assert json.loads(completion.choices[0].message.content) == {"answer": 42}


@pytest.mark.parametrize("vendor", VENDORS)
def test_fallback_on_overload(client, vendor):
    raw = client.chat.completions.with_raw_response.create(
        model=f"{vendor}-fallback", messages=USER
    )
    assert raw.parse().choices[0].message.content == f"Hello from {vendor}!"
    assert raw.headers["x-switchyard-attempts"] == "2"


@pytest.mark.parametrize("vendor", VENDORS)
def test_upstream_5xx_is_502(gateway, vendor):
    response = httpx.post(
        gateway.base_url + "/chat/completions",
        json={"model": f"{vendor}-server-error", "messages": USER},
    )
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "upstream_error"


@pytest.mark.parametrize("vendor", VENDORS)
def test_mid_stream_error_event(client, vendor):
    received = []
    with pytest.raises(openai.APIError):
        for chunk in client.chat.completions.create(
            model=f"{vendor}-stream-error", messages=USER, stream=True
        ):
            received.append(chunk)
    assert any(c.choices and c.choices[0].delta.content for c in received)


def test_gemini_embeddings(client):
    result = client.embeddings.create(model="ge-embed", input=["one", "two"])
    assert [item.index for item in result.data] == [0, 1]
    assert len(result.data[0].embedding) == 8


def test_anthropic_has_no_embeddings(client):
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="anthropic-ok", input="x")
