"""The two new client dialects end to end with the official SDKs: the ``anthropic`` SDK on
``/v1/messages`` and the ``openai`` SDK's Responses client on ``/v1/responses``, against
each managed target kind (OpenAI-compatible, Anthropic and Gemini, faked at the HTTP layer
with their own wire formats). Usage rows name the endpoint; errors come in each dialect's
shape. (The local model behind both dialects: tests/integration/test_dialects_local.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.fixtures.fake_anthropic import FakeAnthropic
from tests.fixtures.fake_gemini import API_KEY as GEMINI_KEY
from tests.fixtures.fake_gemini import FakeGemini
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

pytestmark = pytest.mark.anyio
VENDORS = ["openai", "anthropic", "gemini"]
ADMIN = "sk-admin-dialects"
WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    with (
        serve(FakeOpenAI()) as oa,
        serve(FakeAnthropic()) as an,
        serve(FakeGemini()) as ge,
    ):
        lines = [
            "auth: {admin_key_env: D_ADMIN}",
            "providers:",
            f"  openai: {{type: openai, base_url: '{oa.url}/v1', api_key_env: OA_KEY}}",
            f"  anthropic: {{type: anthropic, base_url: '{an.url}', api_key_env: AN_KEY}}",
            f"  gemini: {{type: gemini, base_url: '{ge.url}', api_key_env: GE_KEY}}",
            "models:",
        ]
        for vendor in VENDORS:
            for scenario in ("ok", "tool", "json", "server-error"):
                lines.append(
                    f"  {vendor}-{scenario}: "
                    f"{{targets: [{{provider: {vendor}, model: m-{scenario}}}]}}"
                )
        env = {"D_ADMIN": ADMIN, "OA_KEY": "sk-oa", "AN_KEY": "sk-ant", "GE_KEY": GEMINI_KEY}
        with running_gateway("\n".join(lines), env) as gw:
            yield gw


def hello(vendor: str) -> str:
    return f"Hello from {vendor}!"


# -- Anthropic Messages ----------------------------------------------------------------------


@pytest.fixture
def claude(gateway: Gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("vendor", VENDORS)
def test_messages_create(claude: anthropic.Anthropic, vendor: str) -> None:
    raw = claude.messages.with_raw_response.create(
        model=f"{vendor}-ok",
        max_tokens=64,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "Say hello"}],
    )
    message = raw.parse()
    assert message.content[0].type == "text" and message.content[0].text == hello(vendor)
    assert message.model == f"{vendor}-ok" and message.stop_reason == "end_turn"
    assert message.usage.output_tokens == 5
    assert raw.headers["x-switchyard-provider"] == vendor


@pytest.mark.parametrize("vendor", VENDORS)
async def test_messages_async_stream_with_tools(gateway: Gateway, vendor: str) -> None:
    client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key="unused", max_retries=0)
    async with client.messages.stream(
        model=f"{vendor}-tool",
        max_tokens=64,
        tools=[WEATHER],
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    ) as stream:
        events = [event.type async for event in stream]
        message = await stream.get_final_message()
    await client.close()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather" and call.input == {"city": "Paris"}
    assert message.stop_reason == "tool_use"


def test_messages_tool_result_turn(claude: anthropic.Anthropic) -> None:
    """A Claude Code style turn: the tool's result goes back, the answer comes."""
    first = claude.messages.create(
        model="anthropic-tool",
        max_tokens=64,
        tools=[WEATHER],
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    call = next(block for block in first.content if block.type == "tool_use")
    second = claude.messages.create(
        model="openai-ok",
        max_tokens=64,
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [block.model_dump() for block in first.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "18 C, sunny"},
                ],
            },
        ],
    )
    assert second.content[0].text == hello("openai")


def test_messages_count_tokens(claude: anthropic.Anthropic) -> None:
    counted = claude.messages.count_tokens(
        model="anthropic-ok", messages=[{"role": "user", "content": "x" * 400}]
    )
    assert counted.input_tokens >= 100


def test_messages_errors_are_in_anthropics_shape(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(
            model="no-such-alias", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    assert missing.value.body["type"] == "error"
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model="openai-ok", max_tokens=8, messages=[])
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.APIStatusError) as upstream:
        claude.messages.create(
            model="openai-server-error", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    assert upstream.value.status_code == 502
    assert upstream.value.body["error"]["type"] == "api_error"


# -- OpenAI Responses ------------------------------------------------------------------------


@pytest.fixture
def oai(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("vendor", VENDORS)
def test_responses_create(oai: openai.OpenAI, vendor: str) -> None:
    response = oai.responses.create(
        model=f"{vendor}-ok",
        instructions="Be brief.",
        input="Say hello",
        reasoning={"effort": "low"},
    )
    assert response.output_text == hello(vendor)
    assert response.status == "completed" and response.model == f"{vendor}-ok"
    assert response.usage is not None
    # Reasoning effort "low" turns thinking on where the vendor has it: thinking tokens are
    # output tokens, and the thoughts come back as a reasoning item before the message.
    thought = [item for item in response.output if item.type == "reasoning"]
    assert bool(thought) == (vendor != "openai")  # the OpenAI fake does not think
    if thought:
        assert response.usage.output_tokens > 5
    else:
        assert response.usage.output_tokens == 5
    assert response.store is False


@pytest.mark.parametrize("vendor", VENDORS)
def test_responses_stream_with_a_function_tool(oai: openai.OpenAI, vendor: str) -> None:
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "Weather",
        "parameters": WEATHER["input_schema"],
    }
    with oai.responses.stream(
        model=f"{vendor}-tool", input="Weather in Paris?", tools=[tool]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}


def test_responses_structured_output(oai: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    response = oai.responses.create(
        model="openai-json",
        input="The answer?",
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema}},
    )
    assert json.loads(response.output_text) == {"answer": 42}


def test_responses_previous_response_id_is_a_clear_400(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        oai.responses.create(model="openai-ok", input="again", previous_response_id="resp_x")
    assert refused.value.body["param"] == "previous_response_id"


def test_rows_name_their_endpoint(
    gateway: Gateway, claude: anthropic.Anthropic, oai: openai.OpenAI
) -> None:
    claude.messages.create(
        model="gemini-ok",
        max_tokens=8,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-request-id": "dialect-messages"},
    )
    oai.responses.create(
        model="gemini-ok", input="hi", extra_headers={"x-request-id": "dialect-responses"}
    )
    rows = httpx.get(
        gateway.url + "/admin/usage", headers={"authorization": f"Bearer {ADMIN}"}
    ).text.splitlines()
    by_id = {r["client_request_id"]: r for r in map(json.loads, rows)}
    assert by_id["dialect-messages"]["endpoint"] == "messages"
    assert by_id["dialect-responses"]["endpoint"] == "responses"
    assert by_id["dialect-messages"]["completion_tokens"] == 5


# -- recorded agent turns, replayed to every target kind --------------------------------------

DIALECTS = Path(__file__).resolve().parents[1] / "fixtures" / "dialects"


def sse_events(text: str) -> list[str]:
    return [line[len("event: ") :] for line in text.splitlines() if line.startswith("event: ")]


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_claude_code_turn_reaches_every_target_kind(gateway: Gateway, vendor: str) -> None:
    """The shape Claude Code sends (system blocks with cache_control, seven tools, tool_use /
    tool_result history, thinking, streaming) answered as Anthropic's event stream."""
    body = json.loads((DIALECTS / "claude_code_turn.json").read_text())
    body["model"] = f"{vendor}-ok"
    answer = httpx.post(gateway.url + "/v1/messages", json=body, timeout=30.0)
    assert answer.status_code == 200, answer.text
    events = sse_events(answer.text)
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_delta" in events and "error" not in events


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_codex_turn_reaches_every_target_kind(gateway: Gateway, vendor: str) -> None:
    """The shape Codex CLI sends (instructions, function tools, function_call and its
    output in the history, reasoning effort, store false, streaming)."""
    body = json.loads((DIALECTS / "codex_turn.json").read_text())
    body["model"] = f"{vendor}-ok"
    answer = httpx.post(gateway.base_url + "/responses", json=body, timeout=30.0)
    assert answer.status_code == 200, answer.text
    events = sse_events(answer.text)
    assert events[0] == "response.created" and events[-1] == "response.completed"
    assert "response.output_text.delta" in events
