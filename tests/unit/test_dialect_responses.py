"""Pure tests of the Responses API codec: requests -> canonical chat requests, canonical
answers -> response objects (validated with the official SDK's ``Response`` model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from openai.types.responses import Response

from core.errors import InvalidRequestError, RateLimitError
from core.wire import (
    ChatResponse,
    FilePart,
    FunctionCall,
    ImagePart,
    Message,
    NamedToolChoice,
    TextPart,
    ToolCall,
)
from gateway.dialects.responses import (
    ResponsesIngress,
    decode_request,
    encode_response,
    error_body,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "dialects"


def decode(**body: Any) -> ResponsesIngress:
    body.setdefault("model", "fast")
    body.setdefault("input", "hi")
    return decode_request(json.dumps(body).encode())


def refused(**body: Any) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        decode(**body)
    assert info.value.status == 400
    return info.value


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


def canonical(ingress: ResponsesIngress) -> dict[str, Any]:
    return msgspec.to_builtins(ingress.chat)  # type: ignore[no-any-return]


# ---------------------------------------------------------------- input
def test_string_input_is_one_user_message_and_instructions_come_first() -> None:
    ingress = decode(input="Hello", instructions="Be brief.")
    assert ingress.chat.messages == [
        Message(role="system", content="Be brief."),
        Message(role="user", content="Hello"),
    ]
    assert ingress.instructions == "Be brief."


def test_messages_keep_roles_and_a_single_text_part_becomes_a_string() -> None:
    ingress = decode(
        input=[
            {"role": "developer", "content": "dev rules"},
            {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "s"}]},
            user({"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}),
            {"role": "assistant", "content": "earlier answer"},
        ]
    )
    assert ingress.chat.messages == [
        Message(role="developer", content="dev rules"),
        Message(role="system", content="s"),
        Message(role="user", content=[TextPart("a"), TextPart("b")]),
        Message(role="assistant", content="earlier answer"),
    ]


def test_assistant_output_text_and_refusal_parts_join_into_one_string() -> None:
    ingress = decode(
        input=[
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": "Part one. ", "annotations": []},
                    {"type": "refusal", "refusal": "I can't do the rest."},
                ],
            }
        ]
    )
    assert ingress.chat.messages == [
        Message(role="assistant", content="Part one. I can't do the rest.")
    ]


def test_images_by_url_and_files_by_data() -> None:
    ingress = decode(
        input=[
            user(
                {"type": "input_text", "text": "what is this?"},
                {"type": "input_image", "image_url": "https://x.test/a.png", "detail": "low"},
                {
                    "type": "input_file",
                    "file_data": "data:application/pdf;base64,AA==",
                    "filename": "a.pdf",
                },
            )
        ]
    )
    content = ingress.chat.messages[0].content
    assert isinstance(content, list)
    text, image, file = content
    assert text == TextPart("what is this?")
    assert isinstance(image, ImagePart)
    assert (image.image_url.url, image.image_url.detail) == ("https://x.test/a.png", "low")
    assert file == FilePart({"file_data": "data:application/pdf;base64,AA==", "filename": "a.pdf"})


def test_function_calls_join_the_assistant_message_before_them() -> None:
    ingress = decode(
        input=[
            user({"type": "input_text", "text": "weather in Oslo and Rome?"}),
            {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "weather",
                "arguments": '{"city":"Oslo"}',
            },
            {
                "type": "function_call",
                "call_id": "c2",
                "name": "weather",
                "arguments": '{"city":"Rome"}',
            },
            {"type": "function_call_output", "call_id": "c1", "output": "3C"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "21C"}],
            },
        ]
    )
    assert ingress.chat.messages[1:] == [
        Message(
            role="assistant",
            content="Checking.",
            tool_calls=[
                ToolCall("c1", FunctionCall("weather", '{"city":"Oslo"}')),
                ToolCall("c2", FunctionCall("weather", '{"city":"Rome"}')),
            ],
        ),
        Message(role="tool", content="3C", tool_call_id="c1"),
        Message(role="tool", content="21C", tool_call_id="c2"),
    ]


def test_a_function_call_with_no_assistant_text_starts_an_assistant_message() -> None:
    ingress = decode(
        input=[
            user({"type": "input_text", "text": "go"}),
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
            {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
        ]
    )
    roles = [(m.role, m.content, [c.id for c in m.tool_calls or []]) for m in ingress.chat.messages]
    assert roles == [
        ("user", "go", []),
        ("assistant", None, ["c1"]),
        ("tool", "done", []),
        ("assistant", None, ["c2"]),
    ]


def test_reasoning_items_from_earlier_turns_are_dropped() -> None:
    ingress = decode(
        input=[
            user({"type": "input_text", "text": "q"}),
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
            {"role": "assistant", "content": "a"},
        ]
    )
    assert [m.role for m in ingress.chat.messages] == ["user", "assistant"]


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "item_reference", "id": "msg_1"}, "input[1]"),
        ({"type": "web_search_call", "id": "ws_1", "status": "completed"}, "input[1].type"),
        (user({"type": "input_image", "file_id": "file-1"}), "input[1].content[0].file_id"),
        (user({"type": "input_image"}), "input[1].content[0].image_url"),
        (user({"type": "input_file", "file_id": "file-1"}), "input[1].content[0].file_id"),
        (
            user({"type": "input_file", "file_url": "https://x.test/a.pdf"}),
            "input[1].content[0].file_url",
        ),
        (user({"type": "input_audio", "input_audio": {}}), "input[1].content[0].type"),
        (
            {"role": "assistant", "content": [{"type": "input_image", "image_url": "https://x"}]},
            "input[1].content[0]",
        ),
        ({"role": "tool", "content": "x"}, "input[1].role"),
        ({"type": "function_call", "name": "f", "arguments": "{}"}, "input[1].call_id"),
        ({"type": "function_call_output", "call_id": "c", "output": 3}, "input[1].output"),
        ("just a string", "input[1]"),
    ],
)
def test_bad_input_items_are_400s_naming_the_path(item: Any, param: str) -> None:
    error = refused(input=[user({"type": "input_text", "text": "q"}), item])
    assert error.param == param
    assert error.message


def test_an_empty_input_list_is_refused() -> None:
    assert refused(input=[]).param == "input"


def test_body_errors_name_the_field() -> None:
    assert refused(temperature=3).param == "temperature"
    assert refused(max_output_tokens=0).param == "max_output_tokens"
    with pytest.raises(InvalidRequestError) as info:
        decode_request(b"{not json")
    assert info.value.code == "invalid_json"
    with pytest.raises(InvalidRequestError) as info:
        decode_request(json.dumps({"input": "x"}).encode())
    assert info.value.param == "model"


# ---------------------------------------------------------------- tools and options
WEATHER = {
    "type": "function",
    "name": "weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}


def test_function_tools_move_under_function_and_tool_choice_maps() -> None:
    ingress = decode(
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "weather"},
        parallel_tool_calls=False,
    )
    body = canonical(ingress)
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Weather for a city",
                "parameters": WEATHER["parameters"],
                "strict": True,
            },
        }
    ]
    assert isinstance(ingress.chat.tool_choice, NamedToolChoice)
    assert body["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert body["parallel_tool_calls"] is False


@pytest.mark.parametrize("choice", ["auto", "none", "required"])
def test_tool_choice_strings_pass(choice: str) -> None:
    assert decode(tools=[WEATHER], tool_choice=choice).chat.tool_choice == choice


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [WEATHER, {"type": "web_search"}]}, "tools[1].type"),
        ({"tools": [{"type": "file_search", "vector_store_ids": ["vs"]}]}, "tools[0].type"),
        ({"tools": [{"type": "computer_use_preview", "display_width": 1}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "parameters": {}}]}, "tools[0].name"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice.type"),
        ({"tool_choice": {"type": "function"}}, "tool_choice.name"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"background": True}, "background"),
    ],
)
def test_what_the_canonical_form_cannot_carry_is_a_400(body: dict[str, Any], param: str) -> None:
    error = refused(**body)
    assert error.param == param


def test_builtin_tool_error_names_the_tool() -> None:
    assert "web_search" in refused(tools=[{"type": "web_search"}]).message


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ({"type": "text"}, None),
        ({"type": "json_object"}, {"type": "json_object"}),
        (
            {
                "type": "json_schema",
                "name": "city",
                "schema": {"type": "object"},
                "strict": True,
                "description": "A city",
            },
            {
                "type": "json_schema",
                "json_schema": {
                    "name": "city",
                    "schema": {"type": "object"},
                    "description": "A city",
                    "strict": True,
                },
            },
        ),
    ],
)
def test_text_format_becomes_response_format(fmt: dict[str, Any], expected: Any) -> None:
    ingress = decode(text={"format": fmt, "verbosity": "low"})
    assert canonical(ingress).get("response_format") == expected


@pytest.mark.parametrize(
    ("effort", "canonical_effort"),
    [
        ("none", "none"),
        ("minimal", "minimal"),
        ("low", "low"),
        ("medium", "medium"),
        ("high", "high"),
        ("xhigh", "high"),
        ("max", "high"),
    ],
)
def test_reasoning_effort(effort: str, canonical_effort: str) -> None:
    ingress = decode(reasoning={"effort": effort, "summary": "auto"})
    assert ingress.chat.reasoning_effort == canonical_effort
    assert ingress.reasoning is not None and ingress.reasoning.effort == effort


def test_sampling_limits_and_flags() -> None:
    ingress = decode(
        max_output_tokens=300,
        temperature=0.2,
        top_p=0.9,
        stream=True,
        store=False,
        previous_response_id="resp_prev",
        metadata={"k": "v"},
        user="u1",
        truncation="auto",
        unknown_field={"ignored": True},
    )
    chat = ingress.chat
    assert (chat.max_completion_tokens, chat.temperature, chat.top_p) == (300, 0.2, 0.9)
    assert chat.stream is True and chat.wants_usage_in_stream()
    assert chat.user == "u1"
    assert (ingress.stream, ingress.store, ingress.previous_response_id) == (
        True,
        False,
        "resp_prev",
    )
    assert (ingress.metadata, ingress.truncation, ingress.max_output_tokens) == (
        {"k": "v"},
        "auto",
        300,
    )


def test_defaults_of_a_bare_request() -> None:
    ingress = decode()
    assert (ingress.store, ingress.stream, ingress.parallel_tool_calls) == (True, False, True)
    assert (ingress.tool_choice, ingress.tools) == ("auto", [])
    assert canonical(ingress) == {"model": "fast", "messages": [{"role": "user", "content": "hi"}]}


def test_safety_identifier_stands_in_for_user() -> None:
    assert decode(safety_identifier="hash-1").chat.user == "hash-1"
    assert decode(safety_identifier="hash-1", user="u").chat.user == "u"


def test_the_raw_body_is_kept() -> None:
    raw = json.dumps({"model": "m", "input": "x", "service_tier": "flex"}).encode()
    assert decode_request(raw).raw == raw


# ---------------------------------------------------------------- a Codex CLI turn
def test_codex_turn_decodes_into_the_expected_canonical_request() -> None:
    raw = (FIXTURES / "codex_turn.json").read_bytes()
    source = json.loads(raw)
    ingress = decode_request(raw)
    chat = ingress.chat
    assert chat.model == "gpt-5-codex"
    assert (chat.stream, ingress.store, chat.reasoning_effort) == (True, False, "medium")
    assert (chat.tool_choice, chat.parallel_tool_calls) == ("auto", False)
    assert [t.function.name for t in chat.tools or []] == [
        "shell",
        "update_plan",
        "apply_patch",
        "view_image",
    ]
    assert chat.tools is not None
    assert chat.tools[0].function.parameters == source["tools"][0]["parameters"]
    assert chat.tools[0].function.strict is False
    items = source["input"]
    calls = [item for item in items if item.get("type") == "function_call"]
    outputs = [item for item in items if item.get("type") == "function_call_output"]
    assert chat.messages == [
        Message(role="system", content=source["instructions"]),
        Message(role="developer", content=items[0]["content"][0]["text"]),
        Message(role="user", content=items[1]["content"][0]["text"]),
        Message(role="user", content=items[2]["content"][0]["text"]),
        # the reasoning item is dropped
        Message(
            role="assistant",
            tool_calls=[ToolCall("call_sh1", FunctionCall("shell", calls[0]["arguments"]))],
        ),
        Message(role="tool", content=outputs[0]["output"], tool_call_id="call_sh1"),
        Message(
            role="assistant",
            content=items[6]["content"][0]["text"],
            tool_calls=[ToolCall("call_ap2", FunctionCall("apply_patch", calls[1]["arguments"]))],
        ),
        Message(role="tool", content=outputs[1]["output"], tool_call_id="call_ap2"),
    ]
    # what the response object echoes
    assert [t.name for t in ingress.tools] == ["shell", "update_plan", "apply_patch", "view_image"]
    assert ingress.text is not None and ingress.text.verbosity == "medium"
    assert ingress.reasoning is not None and ingress.reasoning.summary == "auto"


# ---------------------------------------------------------------- response objects
def answer(
    message: dict[str, Any], finish: str | None = "stop", usage: dict[str, Any] | None = None
) -> ChatResponse:
    body = {
        "id": "chatcmpl-1",
        "created": 1,
        "model": "upstream-model",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
        ],
        "usage": usage,
    }
    return msgspec.convert(body, ChatResponse)


USAGE = {
    "prompt_tokens": 100,
    "completion_tokens": 40,
    "total_tokens": 140,
    "prompt_tokens_details": {"cached_tokens": 64, "cache_creation_tokens": 10},
    "completion_tokens_details": {"reasoning_tokens": 25},
}


def encode(resp: ChatResponse, ingress: ResponsesIngress | None = None) -> tuple[Response, Any]:
    raw = encode_response(resp, ingress or decode(), "resp_0123abcd", 1_700_000_000)
    return Response.model_validate_json(raw), json.loads(raw)


def test_text_answer_is_a_completed_response_with_a_message_item() -> None:
    resp, body = encode(answer({"content": "Hello!"}, usage=USAGE))
    assert (resp.id, resp.object, resp.created_at, resp.status) == (
        "resp_0123abcd",
        "response",
        1_700_000_000,
        "completed",
    )
    assert resp.model == "fast"  # the client's alias, not the upstream's name
    assert resp.output_text == "Hello!"
    assert body["output"] == [
        {
            "type": "message",
            "id": "msg_0123abcd_0",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello!", "annotations": []}],
        }
    ]
    assert body["error"] is None and body["incomplete_details"] is None
    assert body["usage"] == {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 64, "cache_write_tokens": 10},
        "output_tokens": 40,
        "output_tokens_details": {"reasoning_tokens": 25},
        "total_tokens": 140,
    }


def test_reasoning_message_and_function_calls_in_order() -> None:
    resp, body = encode(
        answer(
            {
                "content": "Let me look.",
                "reasoning_content": "The user wants the weather.",
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
                    },
                    {
                        "id": "",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city":"Rome"}'},
                    },
                ],
            },
            finish="tool_calls",
        )
    )
    assert [item["type"] for item in body["output"]] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
    ]
    reasoning, _, first, second = body["output"]
    assert reasoning == {
        "type": "reasoning",
        "id": "rs_0123abcd_0",
        "summary": [{"type": "summary_text", "text": "The user wants the weather."}],
    }
    assert first == {
        "type": "function_call",
        "id": "fc_0123abcd_2",
        "call_id": "call_a",
        "name": "weather",
        "arguments": '{"city":"Oslo"}',
        "status": "completed",
    }
    assert second["call_id"] == "call_0123abcd_3"  # an upstream without ids still gets one
    assert resp.status == "completed" and resp.usage is None


def test_tool_calls_without_text_have_no_message_item() -> None:
    _, body = encode(
        answer(
            {
                "content": None,
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            finish="tool_calls",
        )
    )
    assert [item["type"] for item in body["output"]] == ["function_call"]


def test_refusal_is_a_refusal_part() -> None:
    resp, body = encode(answer({"content": None, "refusal": "I can't help with that."}))
    assert body["output"][0]["content"] == [
        {"type": "refusal", "refusal": "I can't help with that."}
    ]
    assert resp.output_text == ""


@pytest.mark.parametrize(
    ("finish", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")]
)
def test_cut_short_is_incomplete(finish: str, reason: str) -> None:
    resp, body = encode(answer({"content": "Once upon a"}, finish=finish))
    assert resp.status == "incomplete"
    assert body["incomplete_details"] == {"reason": reason}
    assert body["output"][0]["status"] == "incomplete"


def test_the_response_echoes_the_request() -> None:
    ingress = decode(
        instructions="Be brief.",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        text={"format": {"type": "json_object"}},
        reasoning={"effort": "low", "summary": "concise"},
        temperature=0.5,
        top_p=0.8,
        max_output_tokens=99,
        metadata={"run": "7"},
        store=False,
        user="u1",
        previous_response_id="resp_prev",
        truncation="auto",
    )
    resp, body = encode(answer({"content": "{}"}), ingress)
    assert body["instructions"] == "Be brief."
    assert body["tools"] == [WEATHER]
    assert (body["tool_choice"], body["parallel_tool_calls"]) == ("required", False)
    assert body["text"] == {"format": {"type": "json_object"}}
    assert body["reasoning"] == {"effort": "low", "summary": "concise"}
    assert (body["temperature"], body["top_p"], body["max_output_tokens"]) == (0.5, 0.8, 99)
    assert (body["metadata"], body["store"], body["user"]) == ({"run": "7"}, False, "u1")
    assert (body["previous_response_id"], body["truncation"]) == ("resp_prev", "auto")
    assert resp.tools[0].type == "function"


def test_a_bare_request_echoes_openai_defaults() -> None:
    _, body = encode(answer({"content": "x"}))
    assert body["text"] == {"format": {"type": "text"}}
    assert (body["tool_choice"], body["tools"], body["parallel_tool_calls"]) == ("auto", [], True)
    assert (body["truncation"], body["metadata"], body["store"]) == ("disabled", {}, True)
    for field in (
        "instructions",
        "temperature",
        "top_p",
        "max_output_tokens",
        "reasoning",
        "previous_response_id",
        "user",
    ):
        assert body[field] is None


def test_an_empty_answer_is_still_a_message() -> None:
    resp, body = encode(answer({"content": ""}))
    assert resp.output_text == "" and len(body["output"]) == 1


# ---------------------------------------------------------------- errors
def test_error_body_is_openai_shape() -> None:
    exc = RateLimitError("slow down", param="model")
    assert json.loads(error_body(exc)) == {
        "error": {
            "message": "slow down",
            "type": "rate_limit_error",
            "param": "model",
            "code": "rate_limit_exceeded",
        }
    }
