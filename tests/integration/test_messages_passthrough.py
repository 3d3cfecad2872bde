"""``POST /v1/messages`` to Anthropic targets end to end with the official ``anthropic`` SDK:
the client's body reaches the (fake) Anthropic API with only ``model`` replaced, Anthropic's
answer comes back as it was sent (``model`` naming the alias), errors keep their mapping,
fallback to a non-Anthropic target still answers in Anthropic's shape, and the ledger row
carries the tokens Anthropic reported."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import httpx2  # the HTTP library of this anthropic SDK
import msgspec
import pytest

from tests.fixtures.fake_anthropic import SIGNATURE, THINKING_TOKENS, FakeAnthropic
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sk-admin-passthrough"
FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "cache_control": {"type": "ephemeral"},
}
SYSTEM = [
    {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
    {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
]
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Ask the tool.", "signature": SIGNATURE},
            {"type": "text", "text": "Let me look."},
        ],
    },
    {"role": "user", "content": "Go on."},
]
THINKING = {"type": "enabled", "budget_tokens": 2048}


class Fakes:
    def __init__(self) -> None:
        self.anthropic = FakeAnthropic()
        self.openai = FakeOpenAI()


@pytest.fixture(scope="module")
def fakes() -> Fakes:
    return Fakes()


@pytest.fixture(scope="module")
def gateway(fakes: Fakes) -> Iterator[Gateway]:
    with serve(fakes.openai) as oa, serve(fakes.anthropic) as an:
        config = "\n".join(
            [
                "auth: {admin_key_env: P_ADMIN}",
                "providers:",
                f"  openai: {{type: openai, base_url: '{oa.url}/v1', api_key_env: OA_KEY}}",
                f"  anthropic: {{type: anthropic, base_url: '{an.url}', api_key_env: AN_KEY,"
                " anthropic_version: '2023-06-01'}",
                "models:",
                "  claude: {targets: [{provider: anthropic, model: m-ok}]}",
                "  claude-tool: {targets: [{provider: anthropic, model: m-tool}]}",
                "  claude-limited: {targets: [{provider: anthropic, model: m-rate-limited}]}",
                "  claude-broken: {targets: [{provider: anthropic, model: m-server-error}]}",
                "  claude-cut: {targets: [{provider: anthropic, model: m-stream-error}]}",
                "  claude-or-gpt: {targets: [{provider: anthropic, model: m-overloaded},"
                " {provider: openai, model: m-ok}]}",
            ]
        )
        env = {"P_ADMIN": ADMIN, "OA_KEY": "sk-oa", "AN_KEY": "sk-ant-e2e"}
        with running_gateway(config, env) as gw:
            yield gw


class Captured:
    """The bodies the SDK sent (an httpx event hook)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def __call__(self, request: httpx2.Request) -> None:
        self.bodies.append(request.read())


@pytest.fixture
def sent() -> Captured:
    return Captured()


@pytest.fixture
def claude(gateway: Gateway, fakes: Fakes, sent: Captured) -> Iterator[anthropic.Anthropic]:
    fakes.anthropic.requests.clear()
    http = httpx2.Client(event_hooks={"request": [sent]})
    client = anthropic.Anthropic(
        base_url=gateway.url, api_key="unused", max_retries=0, http_client=http
    )
    yield client
    client.close()


def assert_passed_through(client_body: bytes, upstream_body: bytes, model: str) -> None:
    """Every top-level field byte-for-byte what the client sent, except ``model``."""
    client, upstream = FIELDS.decode(client_body), FIELDS.decode(upstream_body)
    assert json.loads(bytes(upstream.pop("model"))) == model
    client.pop("model")
    assert {k: bytes(v) for k, v in upstream.items()} == {k: bytes(v) for k, v in client.items()}


def ledger_row(gateway: Gateway, client_request_id: str) -> dict[str, Any]:
    """The ledger row of one request (a stream's row is committed as it ends: wait a bit)."""
    for _ in range(50):
        rows = httpx.get(
            gateway.url + "/admin/usage", headers={"authorization": f"Bearer {ADMIN}"}
        ).text.splitlines()
        found = [r for r in map(json.loads, rows) if r["client_request_id"] == client_request_id]
        if found:
            return dict(found[0])
        time.sleep(0.05)
    raise AssertionError(f"no ledger row for {client_request_id}")


def test_create_passes_the_body_through(
    gateway: Gateway, claude: anthropic.Anthropic, fakes: Fakes, sent: Captured
) -> None:
    raw = claude.messages.with_raw_response.create(
        model="claude",
        max_tokens=4096,
        system=SYSTEM,
        tools=[WEATHER],
        thinking=THINKING,
        messages=HISTORY,
        extra_body={"future_field": {"nested": [1, 2.5, "x"]}},
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14", "x-request-id": "pt-1"},
    )
    (upstream,) = fakes.anthropic.requests
    assert_passed_through(sent.bodies[-1], upstream.body, "m-ok")
    assert upstream.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    assert upstream.headers["x-api-key"] == "sk-ant-e2e"
    assert upstream.headers["anthropic-version"] == "2023-06-01"
    message = raw.parse()
    assert message.model == "claude"  # the alias, as on every target
    thinking, text = message.content
    assert thinking.type == "thinking" and thinking.signature == SIGNATURE  # signed, kept
    assert text.type == "text" and text.text == "Hello from anthropic!"
    assert raw.headers["x-switchyard-upstream-model"] == "m-ok"
    row = ledger_row(gateway, "pt-1")
    assert row["provider"] == "anthropic" and row["endpoint"] == "messages"
    assert row["prompt_tokens"] == 11 and row["completion_tokens"] == 5 + THINKING_TOKENS


def test_unsigned_thinking_is_not_sent_to_anthropic(
    claude: anthropic.Anthropic, fakes: Fakes
) -> None:
    """A thinking block the gateway wrote for another target's answer has no signature."""
    history = json.loads(json.dumps(HISTORY))
    history[1]["content"][0]["signature"] = ""
    claude.messages.create(model="claude", max_tokens=64, messages=history)
    sent_turn = fakes.anthropic.requests[0].json["messages"][1]
    assert sent_turn["content"] == [{"type": "text", "text": "Let me look."}]


def test_stream_with_tools(
    gateway: Gateway, claude: anthropic.Anthropic, fakes: Fakes, sent: Captured
) -> None:
    with claude.messages.stream(
        model="claude-tool",
        max_tokens=4096,
        system=SYSTEM,
        tools=[WEATHER],
        thinking=THINKING,
        messages=HISTORY,
        extra_headers={"anthropic-beta": "fine-grained-tool-streaming-2025-05-14"},
        extra_body={"future_field": True},
        metadata={"user_id": "u-1"},
    ) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert_passed_through(sent.bodies[-1], fakes.anthropic.requests[0].body, "m-tool")
    assert fakes.anthropic.requests[0].headers["anthropic-beta"] == (
        "fine-grained-tool-streaming-2025-05-14"
    )
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert message.model == "claude-tool"
    thinking, call = message.content
    assert thinking.type == "thinking" and thinking.signature == SIGNATURE
    assert call.type == "tool_use" and call.input == {"city": "Paris"}
    assert message.usage.input_tokens == 11 and message.usage.output_tokens == 30


def test_stream_events_are_anthropics_own(gateway: Gateway, fakes: Fakes) -> None:
    """The raw SSE: Anthropic's order (its ping after the first block start, which the
    translating encoder never writes there), and the row with the streamed usage."""
    body = {"model": "claude", "max_tokens": 64, "stream": True, "messages": HISTORY[:1]}
    headers = {"x-api-key": "unused", "x-request-id": "pt-stream"}
    with httpx.stream("POST", gateway.url + "/v1/messages", json=body, headers=headers) as r:
        text = r.read().decode()
    names = [line[7:] for line in text.splitlines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    row = ledger_row(gateway, "pt-stream")
    assert row["stream"] is True and row["status"] == 200
    assert row["prompt_tokens"] == 11 and row["completion_tokens"] == 5


def test_upstream_errors_map_as_before(claude: anthropic.Anthropic) -> None:
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.RateLimitError) as limited:
        claude.messages.create(model="claude-limited", max_tokens=8, messages=hi)
    assert limited.value.body["error"]["type"] == "rate_limit_error"
    with pytest.raises(anthropic.APIStatusError) as broken:
        claude.messages.create(model="claude-broken", max_tokens=8, messages=hi)
    assert broken.value.status_code == 502
    assert broken.value.body["error"]["type"] == "api_error"


def test_mid_stream_failure_ends_with_an_error_event(gateway: Gateway) -> None:
    body = {"model": "claude-cut", "max_tokens": 64, "stream": True, "messages": HISTORY[:1]}
    with httpx.stream(
        "POST", gateway.url + "/v1/messages", json=body, headers={"x-api-key": "unused"}
    ) as r:
        text = r.read().decode()
    assert text.startswith("event: message_start\n")
    last = text.strip().split("\n\n")[-1]
    assert last.startswith("event: error\n")
    assert json.loads(last.split("data: ", 1)[1])["error"]["type"] in (
        "api_error",
        "overloaded_error",
    )


@pytest.mark.parametrize("streamed", [False, True])
def test_fallback_to_openai_answers_in_anthropics_shape(
    gateway: Gateway, claude: anthropic.Anthropic, fakes: Fakes, streamed: bool
) -> None:
    request_id = f"pt-fallback-{streamed}"
    options: dict[str, Any] = {
        "model": "claude-or-gpt",
        "max_tokens": 64,
        "system": SYSTEM,
        "messages": HISTORY,
        "extra_headers": {"x-request-id": request_id},
    }
    if streamed:
        with claude.messages.stream(**options) as stream:
            message = stream.get_final_message()
    else:
        message = claude.messages.create(**options)
    assert fakes.anthropic.requests[0].json["model"] == "m-overloaded"  # tried first
    assert message.model == "claude-or-gpt" and message.type == "message"
    assert message.content[0].type == "text"
    assert message.content[0].text == "Hello from openai!"
    row = ledger_row(gateway, request_id)
    assert row["provider"] == "openai" and row["completion_tokens"] == 5
