"""``/v1/responses`` passed through to an OpenAI target that serves the Responses API,
end to end with the official ``openai`` SDK: the upstream gets the client's body (only
``model`` and ``store`` changed) and the client gets the upstream's answer and events as
they were sent. Fallback from such a target to an Anthropic one answers in the Responses
shape all the same; a provider with ``responses_api: false`` is translated. The ledger row
carries the upstream's tokens either way."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.fixtures.fake_anthropic import REPLY_TEXT as ANTHROPIC_TEXT
from tests.fixtures.fake_anthropic import FakeAnthropic
from tests.fixtures.fake_openai import RESPONSES_TEXT, FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sk-admin-passthrough"
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
MODELS = {
    "pt-ok": "[{provider: native, model: m-ok}]",
    "pt-tool": "[{provider: native, model: m-tool}]",
    "pt-stream-error": "[{provider: native, model: m-stream-error}]",
    "pt-429": "[{provider: native, model: m-rate-limited}, {provider: an, model: m-ok}]",
    "pt-500": "[{provider: native, model: m-server-error}, {provider: an, model: m-ok}]",
    "tr-ok": "[{provider: compat, model: m-ok}]",
}


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Gateway, FakeOpenAI]]:
    fake = FakeOpenAI()
    with serve(fake) as oa, serve(FakeAnthropic()) as an:
        lines = [
            "auth: {admin_key_env: P_ADMIN}",
            "providers:",
            f"  native: {{type: openai, base_url: '{oa.url}/v1', api_key_env: OA_KEY,"
            " responses_api: true}",
            f"  compat: {{type: openai, base_url: '{oa.url}/v1', api_key_env: OA_KEY,"
            " responses_api: false}",
            f"  an: {{type: anthropic, base_url: '{an.url}', api_key_env: AN_KEY}}",
            "models:",
            *(f"  {alias}: {{targets: {targets}}}" for alias, targets in MODELS.items()),
        ]
        env = {"P_ADMIN": ADMIN, "OA_KEY": "sk-oa", "AN_KEY": "sk-ant"}
        with running_gateway("\n".join(lines), env) as gw:
            yield gw, fake


@pytest.fixture
def oai(served: tuple[Gateway, FakeOpenAI]) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[0].base_url, api_key="unused", max_retries=0)


def row(gateway: Gateway, request_id: str) -> dict[str, Any]:
    lines = httpx.get(
        gateway.url + "/admin/usage", headers={"authorization": f"Bearer {ADMIN}"}
    ).text.splitlines()
    (found,) = [r for r in map(json.loads, lines) if r["client_request_id"] == request_id]
    return found


def test_create_is_passed_through(served, oai: openai.OpenAI) -> None:
    gateway, fake = served
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    raw = oai.responses.with_raw_response.create(
        model="pt-ok",
        instructions="Be brief.",
        input="Say hello",
        reasoning={"effort": "low"},
        text={"format": {"type": "json_schema", "name": "a", "schema": schema}},
        extra_headers={"x-request-id": "pt-create"},
    )
    response = raw.parse()
    assert response.output_text == RESPONSES_TEXT
    assert response.id == "resp_upstream123" and response.model == "m-ok"  # upstream's own
    assert response.store is False
    assert raw.headers["x-switchyard-provider"] == "native"
    sent = fake.requests[-1]
    assert sent.path == "/v1/responses"
    assert sent.json["model"] == "m-ok" and sent.json["store"] is False
    assert sent.json["reasoning"] == {"effort": "low"}
    assert sent.json["text"] == {"format": {"type": "json_schema", "name": "a", "schema": schema}}
    ledger = row(gateway, "pt-create")
    assert (ledger["prompt_tokens"], ledger["completion_tokens"]) == (13, 7)
    assert ledger["cached_tokens"] == 4 and ledger["endpoint"] == "responses"


def test_stream_with_a_function_tool_is_passed_through(served, oai: openai.OpenAI) -> None:
    gateway, fake = served
    with oai.responses.stream(
        model="pt-tool",
        input="Weather in Paris?",
        tools=[TOOL],
        extra_headers={"x-request-id": "pt-stream"},
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert final.id == "resp_upstream123"
    assert fake.requests[-1].json["tools"] == [TOOL]
    ledger = row(gateway, "pt-stream")
    assert (ledger["prompt_tokens"], ledger["completion_tokens"]) == (13, 7)
    assert ledger["stream"] is True


def test_stream_text_events_arrive_as_sent(oai: openai.OpenAI) -> None:
    with oai.responses.stream(model="pt-ok", input="Say hello") as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == RESPONSES_TEXT


def test_mid_stream_failure_ends_with_the_dialects_error_events(served) -> None:
    gateway, _ = served
    body = {"model": "pt-stream-error", "input": "hi", "stream": True}
    headers = {"x-request-id": "pt-cut"}
    url = gateway.base_url + "/responses"
    with httpx.stream("POST", url, json=body, headers=headers) as response:
        text = response.read().decode()
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert events[0]["type"] == "response.created"
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["response"]["id"] == "resp_upstream123"
    ledger = row(gateway, "pt-cut")  # no usage came: the streamed text is billed
    assert ledger["usage_estimated"] is True and ledger["completion_tokens"] >= 1


@pytest.mark.parametrize("alias", ["pt-429", "pt-500"])
@pytest.mark.parametrize("stream", [False, True])
def test_fallback_to_anthropic_answers_in_the_responses_shape(
    served, oai: openai.OpenAI, alias: str, stream: bool
) -> None:
    gateway, _ = served
    request_id = f"pt-fallback-{alias}-{stream}"
    headers = {"x-request-id": request_id}
    if stream:
        with oai.responses.stream(model=alias, input="hi", extra_headers=headers) as events:
            kinds = [event.type for event in events]
            response = events.get_final_response()
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    else:
        response = oai.responses.create(model=alias, input="hi", extra_headers=headers)
    assert response.output_text == ANTHROPIC_TEXT
    assert response.model == alias and response.id.startswith("resp_")  # the gateway's
    ledger = row(gateway, request_id)
    assert ledger["provider"] == "an" and ledger["fallbacks"] >= 1
    assert ledger["completion_tokens"] == 5


@pytest.mark.parametrize("stream", [False, True])
def test_responses_api_false_is_translated(served, oai: openai.OpenAI, stream: bool) -> None:
    gateway, fake = served
    request_id = f"tr-{stream}"
    headers = {"x-request-id": request_id}
    if stream:
        with oai.responses.stream(model="tr-ok", input="hi", extra_headers=headers) as events:
            list(events)
            response = events.get_final_response()
    else:
        response = oai.responses.create(model="tr-ok", input="hi", extra_headers=headers)
    assert response.output_text == "Hello from openai!" and response.model == "tr-ok"
    assert fake.requests[-1].path == "/v1/chat/completions"
    ledger = row(gateway, request_id)
    assert (ledger["prompt_tokens"], ledger["completion_tokens"]) == (11, 5)
