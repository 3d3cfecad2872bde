"""End to end: the official openai SDK -> the gateway over real HTTP -> a fake OpenAI API."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.fixtures.fake_openai import FakeOpenAI

pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "Say hello"}]


def last_body(fake: FakeOpenAI) -> dict:
    return fake.requests[-1].json


def test_chat_sync_returns_upstream_answer_and_route_headers(client, fake):
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=USER)
    completion = raw.parse()
    assert completion.choices[0].message.content == "Hello from openai!"
    assert completion.usage.total_tokens == 16
    assert raw.headers["x-switchyard-provider"] == "oa"
    assert raw.headers["x-request-id"].startswith("req_")
    assert fake.requests[-1].headers["authorization"] == "Bearer sk-test-secret"
    assert last_body(fake)["model"] == "m-ok"


def test_unknown_fields_are_forwarded_untouched(client, fake):
    client.chat.completions.create(
        model="gpt-4o-mini",
        messages=USER,
        seed=7,
        user="u1",
        top_p=0.5,
        extra_body={"vendor_flag": {"nested": [1, 2]}, "logit_bias": {"50256": -100}},
    )
    body = last_body(fake)
    assert body["vendor_flag"] == {"nested": [1, 2]}
    assert body["logit_bias"] == {"50256": -100}
    assert (body["seed"], body["user"], body["top_p"]) == (7, "u1", 0.5)


def test_client_request_id_is_kept(gateway):
    response = httpx.post(
        gateway.base_url + "/chat/completions",
        json={"model": "gpt-4o-mini", "messages": USER},
        headers={"x-request-id": "trace-42"},
    )
    assert response.headers["x-request-id"] == "trace-42"


async def test_chat_async_stream_without_usage(aclient, fake):
    stream = await aclient.chat.completions.create(model="gpt-4o-mini", messages=USER, stream=True)
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from openai!"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks)
    # The gateway asked the upstream for usage anyway, for its own accounting.
    assert last_body(fake)["stream_options"] == {"include_usage": True}


def test_chat_stream_with_usage(client):
    stream = client.chat.completions.create(
        model="cached", messages=USER, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[-1].choices == []
    assert chunks[-1].usage.prompt_tokens == 11
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 7


def test_tools_and_tool_result_turn(client, fake):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    first = client.chat.completions.create(
        model="tools", messages=USER, tools=tools, tool_choice="auto"
    )
    call = first.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )
    assert first.choices[0].finish_reason == "tool_calls"
    followup = [
        *USER,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'},
    ]
    client.chat.completions.create(model="tools", messages=followup, tools=tools)
    sent = last_body(fake)["messages"]
    assert sent[-1] == {"role": "tool", "tool_call_id": "call_abc", "content": '{"temp": 21}'}
    assert sent[-2]["tool_calls"][0]["id"] == "call_abc"


def test_streamed_tool_call_deltas(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    chunks = list(
        client.chat.completions.create(model="tools", messages=USER, tools=tools, stream=True)
    )
    deltas = [
        c.choices[0].delta.tool_calls[0]
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
    ]
    assert deltas[0].id == "call_abc" and deltas[0].function.name == "get_weather"
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_json_schema_response_format_is_forwarded(client, fake):
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
    }
    completion = client.chat.completions.create(
        model="json",
        messages=USER,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": schema, "strict": True},
        },
    )
    assert json.loads(completion.choices[0].message.content) == {"answer": 42}
    assert last_body(fake)["response_format"]["json_schema"]["schema"] == schema


def test_image_content_parts_are_accepted(client, fake):
    content = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": content}]
    )
    assert last_body(fake)["messages"][0]["content"][1]["image_url"]["url"].startswith(
        "data:image/png"
    )


def test_embeddings(client, fake):
    result = client.embeddings.create(model="embed", input=["a", "b"])
    assert [item.index for item in result.data] == [0, 1]
    assert result.usage.prompt_tokens == 8
    assert last_body(fake)["model"] == "text-embedding-3-small"


def test_models_lists_the_configured_aliases(client):
    ids = {model.id for model in client.models.list()}
    assert {"gpt-4o-mini", "tools", "after-5xx", "keyless"} <= ids
    assert client.models.retrieve("tools").id == "tools"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_legacy_completions(client):
    result = client.completions.create(model="gpt-4o-mini", prompt="The capital of France is")
    assert result.choices[0].text == " Paris."
    stream = client.completions.create(model="gpt-4o-mini", prompt="x", stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == " Paris."


def test_health_and_readiness(gateway):
    assert httpx.get(gateway.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(gateway.url + "/readyz")
    assert ready.status_code == 200
    assert ready.json()["disabled"] == {
        "nokey": "environment variable SWITCHYARD_TEST_UNSET_KEY is not set"
    }
