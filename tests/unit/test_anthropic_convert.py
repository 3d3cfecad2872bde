"""Pure conversion tests: OpenAI request -> Anthropic body, Anthropic message -> OpenAI
response (stream events: test_anthropic_stream.py)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import (
    InvalidRequestError,
    UpstreamMalformedError,
)
from core.wire import (
    AudioPart,
    ChatRequest,
    FunctionCall,
    FunctionDef,
    ImagePart,
    ImageURL,
    InputAudio,
    JSONSchemaSpec,
    Message,
    NamedToolChoice,
    ResponseFormat,
    TextPart,
    Tool,
    ToolCall,
    ToolChoiceFunction,
)
from providers.anthropic import convert, wire
from providers.anthropic.convert import JSON_OBJECT_INSTRUCTION


def request(*messages: Message, **options: Any) -> ChatRequest:
    return ChatRequest(model="alias", messages=list(messages), **options)


def body(req: ChatRequest, *, stream: bool = False, default_max: int = 1024) -> dict[str, Any]:
    """The exact JSON Anthropic would receive."""
    built = convert.build_request(req, "claude-x", default_max, stream=stream)
    decoded: dict[str, Any] = json.loads(wire.encoder.encode(built))
    return decoded


USER = Message("user", "Hi")
WEATHER = Tool(
    FunctionDef("get_weather", "Weather by city", {"type": "object", "properties": {"city": {}}})
)


# ---------------------------------------------------------------- requests
def test_minimal_request_has_anthropics_exact_shape() -> None:
    assert body(request(USER)) == {
        "model": "claude-x",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "max_tokens": 1024,
    }


def test_stream_flag_is_sent_only_for_streams() -> None:
    assert body(request(USER), stream=True)["stream"] is True
    assert "stream" not in body(request(USER))


def test_system_and_developer_messages_go_to_top_level_system() -> None:
    one = body(request(Message("system", "Be brief."), USER))
    assert one["system"] == "Be brief."
    assert [m["role"] for m in one["messages"]] == ["user"]
    several = body(
        request(
            Message("system", "Be brief."),
            USER,
            Message("developer", [TextPart("Use French.")]),
        )
    )
    assert several["system"] == [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": "Use French."},
    ]
    assert len(several["messages"]) == 1


def test_system_image_is_rejected() -> None:
    msg = Message("system", [ImagePart(ImageURL("https://x.test/a.png"))])
    with pytest.raises(InvalidRequestError) as info:
        body(request(msg, USER))
    assert info.value.param == "messages"


def test_only_system_messages_are_rejected() -> None:
    with pytest.raises(InvalidRequestError) as info:
        body(request(Message("system", "alone")))
    assert info.value.param == "messages"


def test_consecutive_same_role_turns_are_merged_in_order() -> None:
    sent = body(
        request(
            Message("user", "a"),
            Message("user", [TextPart("b")]),
            Message("assistant", "c"),
            Message("assistant", "d"),
        )
    )
    assert sent["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "c"}, {"type": "text", "text": "d"}],
        },
    ]


def test_tool_turns_become_one_user_message_of_tool_results() -> None:
    calls = [
        ToolCall("toolu_1", FunctionCall("get_weather", '{"city": "Paris"}')),
        ToolCall("toolu_2", FunctionCall("get_weather", "")),
    ]
    sent = body(
        request(
            USER,
            Message("assistant", "Checking.", tool_calls=calls),
            Message("tool", "18C", tool_call_id="toolu_1"),
            Message("tool", [TextPart("20C")], tool_call_id="toolu_2"),
            Message("user", "Thanks"),
        )
    )
    assert sent["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Checking."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "get_weather",
                "input": {"city": "Paris"},
            },
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}},
        ],
    }
    assert sent["messages"][2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
            {
                "type": "tool_result",
                "tool_use_id": "toolu_2",
                "content": [{"type": "text", "text": "20C"}],
            },
            {"type": "text", "text": "Thanks"},
        ],
    }
    assert len(sent["messages"]) == 3


def test_assistant_tool_call_only_message_has_no_empty_text_block() -> None:
    call = ToolCall("t1", FunctionCall("f", "{}"))
    sent = body(
        request(
            USER,
            Message("assistant", "", tool_calls=[call]),
            Message("tool", "", tool_call_id="t1"),
        )
    )
    assert sent["messages"][1]["content"] == [
        {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    ]
    assert sent["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "t1"}]


@pytest.mark.parametrize("arguments", ['{"city": ', "[1, 2]", '"Paris"'])
def test_bad_tool_call_arguments_are_rejected(arguments: str) -> None:
    call = ToolCall("t1", FunctionCall("f", arguments))
    with pytest.raises(InvalidRequestError) as info:
        body(request(USER, Message("assistant", tool_calls=[call])))
    assert info.value.param == "messages"
    assert "messages[1]" in info.value.message


def test_tool_message_without_id_is_rejected() -> None:
    with pytest.raises(InvalidRequestError, match="tool_call_id"):
        body(request(USER, Message("tool", "x")))


def test_max_tokens_default_and_client_limits() -> None:
    assert body(request(USER), default_max=777)["max_tokens"] == 777
    assert body(request(USER, max_tokens=50))["max_tokens"] == 50
    assert body(request(USER, max_tokens=50, max_completion_tokens=60))["max_tokens"] == 60


def test_sampling_options_pass_through() -> None:
    sent = body(
        request(
            USER,
            stop="END",
            temperature=0.5,
            top_p=0.9,
            top_k=40,
            user="u-1",
            seed=3,
            presence_penalty=1.0,
        )
    )
    assert sent["stop_sequences"] == ["END"]
    assert (sent["temperature"], sent["top_p"], sent["top_k"]) == (0.5, 0.9, 40)
    assert sent["metadata"] == {"user_id": "u-1"}
    assert "seed" not in sent and "presence_penalty" not in sent
    assert body(request(USER, stop=["a", "b"]))["stop_sequences"] == ["a", "b"]
    assert body(request(USER, temperature=1.0))["temperature"] == 1.0


def test_temperature_above_one_is_rejected() -> None:
    with pytest.raises(InvalidRequestError) as info:
        body(request(USER, temperature=1.5))
    assert info.value.param == "temperature"
    assert "between 0 and 1" in info.value.message


def test_n_above_one_is_rejected() -> None:
    with pytest.raises(InvalidRequestError) as info:
        body(request(USER, n=2))
    assert info.value.param == "n"
    assert body(request(USER, n=1))["messages"]


def test_tools_are_converted() -> None:
    bare = Tool(FunctionDef("ping"))
    sent = body(request(USER, tools=[WEATHER, bare]))
    assert sent["tools"] == [
        {
            "name": "get_weather",
            "description": "Weather by city",
            "input_schema": {"type": "object", "properties": {"city": {}}},
        },
        {"name": "ping", "input_schema": {"type": "object", "properties": {}}},
    ]
    assert "tool_choice" not in sent


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        ("auto", None, None),
        ("auto", False, {"type": "auto", "disable_parallel_tool_use": True}),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", None, {"type": "any"}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        ("none", False, {"type": "none"}),
        (
            NamedToolChoice(ToolChoiceFunction("get_weather")),
            None,
            {"type": "tool", "name": "get_weather"},
        ),
        (
            NamedToolChoice(ToolChoiceFunction("get_weather")),
            False,
            {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        ),
    ],
)
def test_tool_choice_mapping(choice: Any, parallel: bool | None, expected: Any) -> None:
    sent = body(request(USER, tools=[WEATHER], tool_choice=choice, parallel_tool_calls=parallel))
    assert sent.get("tool_choice") == expected


def test_named_tool_choice_must_name_a_tool() -> None:
    with pytest.raises(InvalidRequestError) as info:
        body(request(USER, tools=[WEATHER], tool_choice=NamedToolChoice(ToolChoiceFunction("x"))))
    assert info.value.param == "tool_choice"


def test_images_become_base64_or_url_sources() -> None:
    parts = [
        TextPart("What is this?"),
        ImagePart(ImageURL("data:image/png;base64,iVBORw0KGgo=")),
        ImagePart(ImageURL("https://example.test/cat.jpg", detail="high")),
    ]
    sent = body(request(Message("user", parts)))
    assert sent["messages"][0]["content"] == [
        {"type": "text", "text": "What is this?"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
        },
        {"type": "image", "source": {"type": "url", "url": "https://example.test/cat.jpg"}},
    ]


@pytest.mark.parametrize("url", ["ftp://x.test/a.png", "data:image/png,rawbytes", "data:;base64,x"])
def test_unusable_image_urls_are_rejected(url: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        body(request(Message("user", [ImagePart(ImageURL(url))])))
    assert info.value.param == "messages"


def test_audio_parts_are_rejected() -> None:
    with pytest.raises(InvalidRequestError, match="AudioPart"):
        body(request(Message("user", [AudioPart(InputAudio("AAAA", "wav"))])))


SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}}
JSON_SCHEMA = ResponseFormat("json_schema", JSONSchemaSpec("answer_schema", SCHEMA))


def test_json_schema_becomes_a_forced_tool() -> None:
    sent = body(request(USER, response_format=JSON_SCHEMA))
    assert sent["tools"] == [
        {
            "name": "answer_schema",
            "input_schema": SCHEMA,
            "description": "Give the answer as this tool's input.",
        }
    ]
    assert sent["tool_choice"] == {
        "type": "tool",
        "name": "answer_schema",
        "disable_parallel_tool_use": True,
    }
    assert convert.json_tool_name(request(USER, response_format=JSON_SCHEMA)) == "answer_schema"
    assert convert.json_tool_name(request(USER)) is None


def test_json_schema_with_tools_is_rejected() -> None:
    with pytest.raises(InvalidRequestError) as info:
        body(request(USER, response_format=JSON_SCHEMA, tools=[WEATHER]))
    assert info.value.param == "response_format"


def test_json_object_adds_a_system_instruction() -> None:
    fmt = ResponseFormat("json_object")
    assert body(request(USER, response_format=fmt))["system"] == JSON_OBJECT_INSTRUCTION
    sent = body(request(Message("system", "Be brief."), USER, response_format=fmt))
    assert sent["system"] == [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": JSON_OBJECT_INSTRUCTION},
    ]
    assert "tools" not in sent


ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool"])


@given(st.lists(st.tuples(ROLES, st.text(min_size=1, max_size=8)), min_size=1, max_size=12))
def test_merged_turns_alternate_and_keep_every_text_in_order(
    items: list[tuple[str, str]],
) -> None:
    messages = [
        Message(role, text, tool_call_id="t" if role == "tool" else None)  # type: ignore[arg-type]
        for role, text in items
    ]
    if all(role in ("system", "developer") for role, _ in items):
        return
    system, turns = convert.convert_messages(messages)
    assert system == [text for role, text in items if role in ("system", "developer")]
    roles = [turn.role for turn in turns]
    assert all(a != b for a, b in itertools.pairwise(roles))
    seen = [
        block.text if isinstance(block, wire.TextBlock) else block.content
        for turn in turns
        for block in turn.content
    ]
    assert seen == [text for role, text in items if role not in ("system", "developer")]


# ---------------------------------------------------------------- responses
def message(
    content: list[dict[str, Any]], stop: str | None = "end_turn", **usage: int
) -> wire.MessagesResponse:
    raw = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x-2025",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 5, **usage},
    }
    return wire.response_decoder.decode(json.dumps(raw))


def respond(msg: wire.MessagesResponse, json_tool: str | None = None) -> dict[str, Any]:
    """The response as builtins (fields equal to their defaults are left out)."""
    out = convert.to_chat_response(msg, created=123, json_tool=json_tool, provider="claude")
    decoded: dict[str, Any] = msgspec.to_builtins(out)
    return decoded


def test_text_response() -> None:
    msg = message([{"type": "text", "text": "Hello"}, {"type": "text", "text": "!"}])
    out = convert.to_chat_response(msg, created=123, json_tool=None, provider="claude")
    wire = msgspec.json.decode(msgspec.json.encode(out))
    assert (out.id, out.model, out.created, wire["object"]) == (
        "msg_1",
        "claude-x-2025",
        123,
        "chat.completion",
    )
    assert wire["choices"][0]["message"]["role"] == "assistant"
    assert len(out.choices) == 1
    choice = out.choices[0]
    assert (choice.index, choice.finish_reason) == (0, "stop")
    assert choice.message.content == "Hello!"
    assert choice.message.tool_calls is None
    assert msgspec.to_builtins(out.usage) == {
        "prompt_tokens": 11,
        "completion_tokens": 5,
        "total_tokens": 16,
    }


def test_tool_use_response_and_skipped_block_kinds() -> None:
    out = respond(
        message(
            [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
            stop="tool_use",
        )
    )
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"].get("content") is None
    [call] = choice["message"]["tool_calls"]
    assert (call["id"], call["function"]["name"]) == ("toolu_1", "get_weather")
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_tool_use_without_id_is_malformed() -> None:
    with pytest.raises(UpstreamMalformedError):
        respond(message([{"type": "tool_use", "name": "f", "input": {}}]))


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        (None, "stop"),
    ],
)
def test_stop_reason_mapping(stop: str | None, finish: str) -> None:
    assert (
        respond(message([{"type": "text", "text": "x"}], stop))["choices"][0]["finish_reason"]
        == finish
    )


def test_cache_usage_counts_into_prompt_tokens() -> None:
    out = respond(
        message(
            [{"type": "text", "text": "x"}],
            input_tokens=2,
            cache_read_input_tokens=7,
            cache_creation_input_tokens=2,
        )
    )
    assert out["usage"] == {
        "prompt_tokens": 11,
        "completion_tokens": 5,
        "total_tokens": 16,
        "prompt_tokens_details": {"cached_tokens": 7, "cache_creation_tokens": 2},
    }


def test_json_schema_tool_use_comes_back_as_text() -> None:
    out = respond(
        message(
            [{"type": "tool_use", "id": "t", "name": "answer_schema", "input": {"answer": 42}}],
            stop="tool_use",
        ),
        "answer_schema",
    )
    choice = out["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert json.loads(choice["message"]["content"]) == {"answer": 42}
    assert "tool_calls" not in choice["message"]


@given(st.text())
def test_response_text_round_trips(text: str) -> None:
    out = respond(message([{"type": "text", "text": text}]))
    assert out["choices"][0]["message"]["content"] == text
