"""The Anthropic Messages dialect, request side: what Anthropic clients send decodes into the
canonical ``ChatRequest`` (gateway/dialects/anthropic_messages.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import msgspec
import pytest

from core.errors import InvalidRequestError
from core.wire import (
    ChatRequest,
    FilePart,
    ImagePart,
    ImageURL,
    Message,
    NamedToolChoice,
    TextPart,
    ToolChoiceFunction,
)
from gateway.dialects.anthropic_messages import MessagesIngress, decode_request

FIXTURES = Path(__file__).parent.parent / "fixtures" / "dialects"
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


def body(**fields: Any) -> bytes:
    base: dict[str, Any] = {
        "model": "claude-x",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "hi"}],
    }
    base.update(fields)
    return json.dumps(base).encode()


def decode(**fields: Any) -> ChatRequest:
    return decode_request(body(**fields)).request


def refused(raw: bytes) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        decode_request(raw)
    assert info.value.status == 400
    return info.value


def canonical_round_trip(req: ChatRequest) -> ChatRequest:
    """The canonical request survives its own schema (what an OpenAI target would get)."""
    return msgspec.json.decode(msgspec.json.encode(req), type=ChatRequest)


# ---------------------------------------------------------------- the basics
def test_minimal_request() -> None:
    raw = body()
    ingress = decode_request(raw)
    assert isinstance(ingress, MessagesIngress)
    assert ingress.raw is raw
    assert ingress.stream is False
    assert ingress.wants_thinking is False
    req = ingress.request
    assert req.model == "claude-x"
    assert req.max_tokens == 256
    assert req.messages == [Message("user", "hi")]
    assert req.stream is False and req.stream_options is None
    assert req.reasoning_effort is None
    assert canonical_round_trip(req) == req


def test_sampling_and_metadata_fields() -> None:
    req = decode(
        temperature=0.3,
        top_p=0.9,
        top_k=40,
        stop_sequences=["END", "###"],
        metadata={"user_id": "u-1"},
        service_tier="auto",
    )
    assert (req.temperature, req.top_p, req.top_k) == (0.3, 0.9, 40)
    assert req.stop == ["END", "###"]
    assert req.user == "u-1"
    assert decode_request(body(service_tier="standard_only")).service_tier == "standard_only"


def test_more_than_four_stop_sequences_are_kept() -> None:
    # Anthropic allows many; the canonical type says 4 (OpenAI's limit): the codec keeps them
    # all and leaves the limit to the targets that have it.
    stops = [f"s{i}" for i in range(7)]
    assert decode(stop_sequences=stops).stop == stops


def test_stream_asks_for_usage() -> None:
    ingress = decode_request(body(stream=True))
    assert ingress.stream is True
    assert ingress.request.stream is True
    assert ingress.request.wants_usage_in_stream()


def test_unknown_fields_are_ignored() -> None:
    req = decode(
        container="c-1",
        cache_control={"type": "ephemeral"},
        context_management={"edits": []},
        future_field={"x": [1, 2]},
    )
    assert req.messages == [Message("user", "hi")]


# ---------------------------------------------------------------- system
def test_system_string() -> None:
    req = decode(system="Be brief.")
    assert req.messages[0] == Message("system", "Be brief.")
    assert req.messages[1] == Message("user", "hi")


def test_system_blocks_with_cache_control() -> None:
    blocks = [
        {"type": "text", "text": "You are a CLI.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Rules.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
    ]
    req = decode(system=blocks)
    assert req.messages[0] == Message("system", [TextPart("You are a CLI."), TextPart("Rules.")])
    single = decode(system=blocks[:1])
    assert single.messages[0] == Message("system", "You are a CLI.")


def test_empty_system_adds_nothing() -> None:
    assert decode(system="").messages == [Message("user", "hi")]
    assert decode(system=[]).messages == [Message("user", "hi")]


def test_system_block_must_be_text() -> None:
    exc = refused(body(system=[{"type": "image", "text": "x"}]))
    assert exc.param == "system.0.type"


# ---------------------------------------------------------------- user content
def test_user_text_blocks() -> None:
    content = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    req = decode(messages=[{"role": "user", "content": content}])
    assert req.messages == [Message("user", [TextPart("a"), TextPart("b")])]
    one = decode(messages=[{"role": "user", "content": content[:1]}])
    assert one.messages == [Message("user", "a")]


def test_images_base64_and_url() -> None:
    content = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
        {"type": "text", "text": "what is this?"},
    ]
    req = decode(messages=[{"role": "user", "content": content}])
    assert req.messages[0].content == [
        ImagePart(ImageURL(f"data:image/png;base64,{PNG}")),
        ImagePart(ImageURL("https://example.com/a.jpg")),
        TextPart("what is this?"),
    ]
    assert canonical_round_trip(req) == req


def test_documents() -> None:
    content = [
        {
            "type": "document",
            "title": "spec.pdf",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="},
        },
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": "notes"},
        },
    ]
    req = decode(messages=[{"role": "user", "content": content}])
    assert req.messages[0].content == [
        FilePart({"filename": "spec.pdf", "file_data": "data:application/pdf;base64,JVBERi0="}),
        TextPart("notes"),
    ]


@pytest.mark.parametrize(
    ("block", "param"),
    [
        ({"type": "image"}, "messages.0.content.0.source"),
        (
            {"type": "image", "source": {"type": "file", "file_id": "f"}},
            "messages.0.content.0.source",
        ),
        (
            {"type": "image", "source": {"type": "base64", "data": PNG}},
            "messages.0.content.0.source",
        ),
        (
            {"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}},
            "messages.0.content.0.source",
        ),
        ({"type": "text"}, "messages.0.content.0.text"),
        ({"type": "search_result", "title": "t"}, "messages.0.content.0.type"),
        ({"type": "tool_use", "id": "t", "name": "n", "input": {}}, "messages.0.content.0.type"),
    ],
)
def test_bad_user_blocks_name_the_path(block: dict[str, Any], param: str) -> None:
    exc = refused(body(messages=[{"role": "user", "content": [block]}]))
    assert exc.param == param
    assert exc.message.startswith(param + ":")


# ---------------------------------------------------------------- tool turns
def tool_turns(result: dict[str, Any], *extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "weather",
                    "input": {"city": "Paris", "days": [1, 2]},
                },
            ],
        },
        {"role": "user", "content": [result, *extra]},
    ]


def test_tool_use_becomes_tool_calls() -> None:
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}
    req = decode(messages=tool_turns(result))
    assistant = req.messages[1]
    assert assistant.role == "assistant"
    assert assistant.content == "Let me check."
    assert assistant.tool_calls is not None
    call = assistant.tool_calls[0]
    assert (call.id, call.function.name) == ("toolu_1", "weather")
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": [1, 2]}
    assert req.messages[2] == Message("tool", "sunny", tool_call_id="toolu_1")
    assert len(req.messages) == 3
    assert canonical_round_trip(req) == req


def test_tool_use_without_text() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "noargs", "input": {}}],
        },
    ]
    assistant = decode(messages=messages).messages[1]
    assert assistant.content is None
    assert assistant.tool_calls is not None
    assert assistant.tool_calls[0].function.arguments == "{}"


def test_tool_result_blocks_and_is_error() -> None:
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": "line 1"}, {"type": "text", "text": "line 2"}],
        "is_error": True,
    }
    req = decode(messages=tool_turns(result))
    assert req.messages[2] == Message("tool", "Error: line 1\nline 2", tool_call_id="toolu_1")


def test_tool_result_without_content() -> None:
    req = decode(messages=tool_turns({"type": "tool_result", "tool_use_id": "toolu_1"}))
    assert req.messages[2] == Message("tool", "", tool_call_id="toolu_1")


def test_mixed_user_turn_is_tool_messages_then_user() -> None:
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}
    text = {"type": "text", "text": "and tomorrow?", "cache_control": {"type": "ephemeral"}}
    req = decode(messages=tool_turns(result, text))
    assert [m.role for m in req.messages] == ["user", "assistant", "tool", "user"]
    assert req.messages[3] == Message("user", "and tomorrow?")


def test_images_in_tool_results_follow_in_a_user_message() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": "screenshot:"}, image],
    }
    req = decode(messages=tool_turns(result, {"type": "text", "text": "look"}))
    assert req.messages[2] == Message("tool", "screenshot:", tool_call_id="toolu_1")
    assert req.messages[3] == Message(
        "user", [ImagePart(ImageURL(f"data:image/png;base64,{PNG}")), TextPart("look")]
    )


def test_tool_result_needs_its_id() -> None:
    exc = refused(body(messages=tool_turns({"type": "tool_result", "content": "x"})))
    assert exc.param == "messages.2.content.0.tool_use_id"


@pytest.mark.parametrize(
    ("block", "param"),
    [
        ({"type": "tool_use", "name": "n", "input": {}}, "messages.1.content.0.id"),
        ({"type": "tool_use", "id": "t", "input": {}}, "messages.1.content.0.name"),
        ({"type": "tool_use", "id": "t", "name": "n", "input": [1]}, "messages.1.content.0.input"),
        ({"type": "image", "source": {"type": "url", "url": "u"}}, "messages.1.content.0.type"),
        (
            {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}},
            "messages.1.content.0.type",
        ),
    ],
)
def test_bad_assistant_blocks(block: dict[str, Any], param: str) -> None:
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": [block]}]
    assert refused(body(messages=messages)).param == param


# ---------------------------------------------------------------- thinking in history
def test_thinking_blocks_of_earlier_turns_are_dropped() -> None:
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "answer"},
            ],
        },
        {"role": "user", "content": "more"},
    ]
    req = decode(messages=messages)
    assert req.messages == [
        Message("user", "q"),
        Message("assistant", "answer"),
        Message("user", "more"),
    ]


def test_assistant_turn_of_only_thinking_disappears() -> None:
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"}],
        },
    ]
    assert decode(messages=messages).messages == [Message("user", "q")]


def test_assistant_prefill_string() -> None:
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "The answer is ("},
    ]
    assert decode(messages=messages).messages[1] == Message("assistant", "The answer is (")


# ---------------------------------------------------------------- tools and tool_choice
def test_tools_become_function_tools() -> None:
    tools = [
        {
            "name": "search",
            "description": "Search.",
            "input_schema": SCHEMA,
            "cache_control": {"type": "ephemeral"},
        },
        {"type": "custom", "name": "noop", "input_schema": {"type": "object"}},
    ]
    req = decode(tools=tools)
    assert req.tools is not None
    assert [t.function.name for t in req.tools] == ["search", "noop"]
    assert req.tools[0].function.description == "Search."
    assert req.tools[0].function.parameters == SCHEMA
    assert req.tools[1].function.description is None
    assert canonical_round_trip(req) == req


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    ],
)
def test_server_and_builtin_tools_are_refused(tool: dict[str, Any]) -> None:
    tools = [{"name": "search", "input_schema": SCHEMA}, tool]
    exc = refused(body(tools=tools))
    assert exc.param == "tools.1"
    assert tool["type"] in exc.message
    assert exc.message.startswith("tools.1:")


def test_tool_needs_input_schema() -> None:
    assert refused(body(tools=[{"name": "x"}])).param == "tools.0.input_schema"


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "required", None),
        ({"type": "none"}, "none", None),
        ({"type": "tool", "name": "search"}, NamedToolChoice(ToolChoiceFunction("search")), None),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
        (
            {"type": "tool", "name": "search", "disable_parallel_tool_use": True},
            NamedToolChoice(ToolChoiceFunction("search")),
            False,
        ),
        ({"type": "auto", "disable_parallel_tool_use": False}, "auto", None),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: object, parallel: bool | None) -> None:
    req = decode(tools=[{"name": "search", "input_schema": SCHEMA}], tool_choice=choice)
    assert req.tool_choice == expected
    assert req.parallel_tool_calls is parallel
    assert canonical_round_trip(req) == req


def test_tool_choice_without_tools_is_dropped() -> None:
    req = decode(tool_choice={"type": "any"})
    assert req.tool_choice is None and req.tools is None


@pytest.mark.parametrize("choice", [{"type": "tool"}, {"type": "tool", "name": "other"}])
def test_tool_choice_must_name_a_tool(choice: dict[str, Any]) -> None:
    exc = refused(body(tools=[{"name": "search", "input_schema": SCHEMA}], tool_choice=choice))
    assert exc.param == "tool_choice.name"


def test_unknown_tool_choice_type() -> None:
    exc = refused(
        body(tools=[{"name": "search", "input_schema": SCHEMA}], tool_choice={"type": "some"})
    )
    assert exc.param == "tool_choice.type"


# ---------------------------------------------------------------- thinking -> reasoning_effort
@pytest.mark.parametrize(
    ("thinking", "effort", "wants"),
    [
        ({"type": "enabled", "budget_tokens": 1024}, "low", True),
        ({"type": "enabled", "budget_tokens": 2047}, "low", True),
        ({"type": "enabled", "budget_tokens": 2048}, "medium", True),
        ({"type": "enabled", "budget_tokens": 8191}, "medium", True),
        ({"type": "enabled", "budget_tokens": 8192}, "high", True),
        ({"type": "enabled", "budget_tokens": 31999}, "high", True),
        ({"type": "disabled"}, "none", False),
        ({"type": "adaptive"}, None, True),
    ],
)
def test_thinking_budget_to_reasoning_effort(
    thinking: dict[str, Any], effort: str | None, wants: bool
) -> None:
    ingress = decode_request(body(thinking=thinking))
    assert ingress.request.reasoning_effort == effort
    assert ingress.wants_thinking is wants
    assert canonical_round_trip(ingress.request) == ingress.request


@pytest.mark.parametrize(
    ("effort", "expected"),
    [("low", "low"), ("medium", "medium"), ("high", "high"), ("xhigh", "high"), ("max", "high")],
)
def test_output_config_effort(effort: str, expected: str) -> None:
    req = decode(thinking={"type": "adaptive"}, output_config={"effort": effort})
    assert req.reasoning_effort == expected
    # effort wins over a budget; disabled thinking wins over both
    both = decode(
        thinking={"type": "enabled", "budget_tokens": 1024}, output_config={"effort": effort}
    )
    assert both.reasoning_effort == expected
    assert (
        decode(thinking={"type": "disabled"}, output_config={"effort": effort}).reasoning_effort
        == "none"
    )


def test_enabled_thinking_needs_a_budget() -> None:
    assert refused(body(thinking={"type": "enabled"})).param == "thinking.budget_tokens"


def test_output_format_json_schema() -> None:
    req = decode(output_config={"format": {"type": "json_schema", "schema": SCHEMA}})
    assert req.response_format is not None
    assert req.response_format.type == "json_schema"
    assert req.response_format.json_schema is not None
    assert req.response_format.json_schema.schema == SCHEMA
    assert (
        refused(body(output_config={"format": {"type": "text"}})).param
        == "output_config.format.type"
    )


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}', "max_tokens"),
        (b'{"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": "m", "max_tokens": 5}', "messages"),
        (
            b'{"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}',
            "max_tokens",
        ),
        (
            b'{"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}',
            "messages.0.role",
        ),
        (
            b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": 7}]}',
            "messages.0.content",
        ),
        (
            b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"text": "x"}]}]}',
            "messages.0.content.0.type",
        ),
        (
            b'{"model": "m", "max_tokens": 5, "temperature": 1.5, "messages": [{"role": "user", "content": "x"}]}',
            "temperature",
        ),
        (
            b'{"model": "m", "max_tokens": 5, "top_k": 0, "messages": [{"role": "user", "content": "x"}]}',
            "top_k",
        ),
        (b'{"model": "m", "max_tokens": 5, "messages": []}', "messages"),
        (
            b'{"model": "m", "max_tokens": 5, "messages": [{"role": "assistant", "content": ""}]}',
            "messages",
        ),
        (
            b'{"model": "", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}',
            "model",
        ),
        (
            b'{"model": "m", "max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": "x"}, "messages": [{"role": "user", "content": "x"}]}',
            "thinking.budget_tokens",
        ),
    ],
)
def test_schema_errors_name_the_field(raw: bytes, param: str) -> None:
    exc = refused(raw)
    assert exc.param == param
    assert exc.message.startswith(f"{param}: ")


@pytest.mark.parametrize("raw", [b"", b"{", b"[1, 2]", b"not json", b'"text"'])
def test_not_an_object(raw: bytes) -> None:
    exc = refused(raw)
    assert exc.message


# ---------------------------------------------------------------- what the official SDK sends
def sdk_request_body(**params: Any) -> bytes:
    """The exact body ``anthropic.Anthropic().messages.create(**params)`` sends."""
    sent: list[bytes] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        sent.append(request.content)
        return httpx2.Response(
            400,
            json={"type": "error", "error": {"type": "invalid_request_error", "message": "stop"}},
        )

    client = anthropic.Anthropic(
        api_key="k",
        base_url="http://gateway",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(**params)
    return sent[0]


def test_a_request_built_by_the_sdk() -> None:
    raw = sdk_request_body(
        model="claude-x",
        max_tokens=1000,
        system=[{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_9",
                        "name": "weather",
                        "input": {"city": "Oslo"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "-3C"}],
            },
        ],
        tools=[{"name": "weather", "description": "Weather.", "input_schema": SCHEMA}],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 4096},
        stop_sequences=["\n\nHuman:"],
        metadata={"user_id": "u"},
    )
    req = decode_request(raw).request
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool"]
    assert req.tool_choice == "auto" and req.parallel_tool_calls is False
    assert req.reasoning_effort == "medium"
    assert req.stop == ["\n\nHuman:"]
    assert req.user == "u"
    assert canonical_round_trip(req) == req


# ---------------------------------------------------------------- a Claude Code turn
def test_claude_code_turn_fixture() -> None:
    raw = (FIXTURES / "claude_code_turn.json").read_bytes()
    ingress = decode_request(raw)
    req = ingress.request
    assert ingress.stream is True and ingress.wants_thinking is True
    assert req.model == "claude-sonnet-4-5"
    assert req.max_tokens == 32000
    assert req.temperature == 1
    assert req.reasoning_effort == "high"
    assert req.user == "user_4f2a_account_9c1e_session_7b3d"
    assert req.wants_usage_in_stream()
    assert req.tools is not None
    assert [t.function.name for t in req.tools] == [
        "Task",
        "Bash",
        "Glob",
        "Grep",
        "Read",
        "Edit",
        "TodoWrite",
    ]
    todo = req.tools[-1].function.parameters
    assert todo is not None and todo["properties"]["todos"]["type"] == "array"

    roles = [m.role for m in req.messages]
    assert roles == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "user",
        "assistant",
        "tool",
        "user",
    ]
    system, ask, first, read1, read2, screenshot, second, bash, reminder = req.messages
    assert isinstance(system.content, list) and len(system.content) == 2
    assert system.content[0] == TextPart(
        "You are Claude Code, Anthropic's official CLI for Claude."
    )
    assert isinstance(ask.content, list) and len(ask.content) == 2
    # the first assistant turn: thinking dropped, text kept, two tool calls in order
    assert first.content == "I'll read the test and the CI screenshot."
    assert first.tool_calls is not None
    assert [c.id for c in first.tool_calls] == ["toolu_01RtX1", "toolu_01RtX2"]
    assert json.loads(first.tool_calls[1].function.arguments) == {
        "file_path": "/home/dev/calc/ci.png"
    }
    assert read1.tool_call_id == "toolu_01RtX1"
    assert isinstance(read1.content, str) and "def test_add" in read1.content
    # the image the Read tool returned travels in the user message after the tool messages
    assert read2 == Message("tool", "", tool_call_id="toolu_01RtX2")
    assert isinstance(screenshot.content, list)
    assert isinstance(screenshot.content[0], ImagePart)
    assert screenshot.content[0].image_url.url.startswith("data:image/png;base64,iVBOR")
    # the second assistant turn: redacted thinking dropped, one Bash call
    assert second.content is None
    assert second.tool_calls is not None
    assert json.loads(second.tool_calls[0].function.arguments)["command"].startswith(
        "python -m pytest"
    )
    assert bash == Message("tool", "Error: F\n1 failed: assert 5 == 4", tool_call_id="toolu_01RtX3")
    assert isinstance(reminder.content, str) and "TodoWrite" in reminder.content
    assert canonical_round_trip(req) == req
    # nothing in the canonical form carries Anthropic-only markers
    assert b"cache_control" not in msgspec.json.encode(req)
    assert b"signature" not in msgspec.json.encode(req)
