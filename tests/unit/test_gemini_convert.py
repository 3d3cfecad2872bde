"""Pure conversions between OpenAI shapes and Gemini's, both ways (no I/O)."""

from __future__ import annotations

import base64
import itertools
import struct
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import InvalidRequestError, UpstreamMalformedError
from core.wire import (
    AssistantMessage,
    ChatChunk,
    ChatRequest,
    ChatResponse,
    Choice,
    EmbeddingResponse,
    make_usage,
)
from providers.gemini.convert import to_gemini_request
from providers.gemini.response import (
    embed_request,
    embedding_body,
    finish_reason,
    read_error,
    to_chat_response,
)
from providers.gemini.schema import UNSUPPORTED_KEYS, to_gemini_schema
from providers.gemini.stream import StreamConverter
from providers.gemini.wire import GenerateContentResponse, encoder, response_decoder


def chat(**fields: Any) -> ChatRequest:
    fields.setdefault("model", "gemini-x")
    fields.setdefault("messages", [{"role": "user", "content": "hi"}])
    return msgspec.convert(fields, ChatRequest)


def body(**fields: Any) -> dict[str, Any]:
    """The JSON Gemini would receive for a chat request with ``fields``."""
    result: dict[str, Any] = msgspec.json.decode(encoder.encode(to_gemini_request(chat(**fields))))
    return result


def gemini(payload: dict[str, Any]) -> GenerateContentResponse:
    return response_decoder.decode(msgspec.json.encode(payload))


def respond(payload: dict[str, Any]) -> ChatResponse:
    return to_chat_response(
        gemini(payload), model="gemini-x", fallback_id="chatcmpl-r1", created=5, provider="g"
    )


def calls_of(message: AssistantMessage) -> list[tuple[str, str, str, str]]:
    """(id, type, name, arguments) of each tool call as it goes on the wire."""
    wire = msgspec.to_builtins(message.tool_calls or [])
    return [(c["id"], c["type"], c["function"]["name"], c["function"]["arguments"]) for c in wire]


def text_parts(*texts: str) -> list[dict[str, str]]:
    return [{"text": t} for t in texts]


# ---------------------------------------------------------------- requests: messages
def test_system_and_developer_become_system_instruction() -> None:
    sent = body(
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "developer", "content": [{"type": "text", "text": "use French"}]},
            {"role": "user", "content": "hi"},
        ]
    )
    assert sent == {
        "systemInstruction": {"parts": text_parts("be brief", "use French")},
        "contents": [{"role": "user", "parts": text_parts("hi")}],
    }


def test_roles_map_and_consecutive_turns_merge() -> None:
    sent = body(
        messages=[
            {"role": "user", "content": "a"},
            {"role": "user", "content": "b"},
            {"role": "assistant", "content": "c"},
            {"role": "assistant", "content": "d"},
            {"role": "user", "content": "e"},
        ]
    )
    assert sent["contents"] == [
        {"role": "user", "parts": text_parts("a", "b")},
        {"role": "model", "parts": text_parts("c", "d")},
        {"role": "user", "parts": text_parts("e")},
    ]


def test_only_system_messages_cannot_be_sent() -> None:
    with pytest.raises(InvalidRequestError) as info:
        body(messages=[{"role": "system", "content": "x"}])
    assert info.value.param == "messages"


def test_images_become_inline_data_or_file_data() -> None:
    urls = [
        "data:image/png;base64,iVBORw0K",
        "https://example.com/cat.png",
        "https://example.com/photos/dog.WEBP?size=large",
        "http://example.com/no-extension",
        "data:,hi%20there",
    ]
    content = [{"type": "text", "text": "what is this"}] + [
        {"type": "image_url", "image_url": {"url": url}} for url in urls
    ]
    parts = body(messages=[{"role": "user", "content": content}])["contents"][0]["parts"]
    assert parts == [
        {"text": "what is this"},
        {"inlineData": {"mimeType": "image/png", "data": "iVBORw0K"}},
        {"fileData": {"mimeType": "image/png", "fileUri": urls[1]}},
        {"fileData": {"mimeType": "image/webp", "fileUri": urls[2]}},
        {"fileData": {"mimeType": "image/jpeg", "fileUri": urls[3]}},
        {"inlineData": {"mimeType": "image/jpeg", "data": base64.b64encode(b"hi there").decode()}},
    ]


@pytest.mark.parametrize("url", ["ftp://example.com/a.png", "data:image/png;base64"])
def test_unusable_image_urls_are_rejected(url: str) -> None:
    content = [{"type": "image_url", "image_url": {"url": url}}]
    with pytest.raises(InvalidRequestError) as info:
        body(messages=[{"role": "user", "content": content}])
    assert info.value.param == "messages[0].content[0]"


def test_audio_and_file_parts_become_inline_data() -> None:
    content = [
        {"type": "input_audio", "input_audio": {"data": "UklGR", "format": "wav"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0x"}},
    ]
    parts = body(messages=[{"role": "user", "content": content}])["contents"][0]["parts"]
    assert parts == [
        {"inlineData": {"mimeType": "audio/wav", "data": "UklGR"}},
        {"inlineData": {"mimeType": "application/pdf", "data": "JVBERi0x"}},
    ]
    with pytest.raises(InvalidRequestError):
        body(messages=[{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}])


def tool_turns(result: str) -> list[dict[str, Any]]:
    call = {"id": "abc", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    call["function"]["arguments"] = '{"city": "Paris"}'
    return [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "abc", "content": result},
        {"role": "user", "content": "thanks"},
    ]


def test_tool_calls_and_results_become_function_parts() -> None:
    sent = body(messages=tool_turns('{"temp": 21}'))
    assert sent["contents"] == [
        {"role": "user", "parts": text_parts("weather?")},
        {
            "role": "model",
            "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "get_weather", "response": {"temp": 21}}},
                {"text": "thanks"},
            ],
        },
    ]


@pytest.mark.parametrize("result", ["sunny", "[1, 2]", "42"])
def test_non_object_tool_results_travel_as_content_text(result: str) -> None:
    part = body(messages=tool_turns(result))["contents"][2]["parts"][0]
    assert part["functionResponse"]["response"] == {"content": result}


def test_tool_result_without_matching_call_is_rejected() -> None:
    messages = [
        {"role": "user", "content": "x"},
        {"role": "tool", "tool_call_id": "zz", "content": "1"},
    ]
    with pytest.raises(InvalidRequestError) as info:
        body(messages=messages)
    assert info.value.param == "messages[1].tool_call_id"


def test_tool_call_arguments_must_be_a_json_object() -> None:
    messages = tool_turns("1")
    messages[1]["tool_calls"][0]["function"]["arguments"] = "[1]"
    with pytest.raises(InvalidRequestError) as info:
        body(messages=messages)
    assert info.value.param == "messages[1].tool_calls[0].function"


# ---------------------------------------------------------------- requests: tools, config
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "strict": True,
        "parameters": {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "city": {"type": "string", "description": "City"},
                "strict": {"type": "boolean"},
                "when": {"$ref": "#/$defs/When", "description": "day"},
                "tags": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"k": {"type": "string"}},
                    },
                },
            },
            "required": ["city"],
            "$defs": {"When": {"type": "string", "enum": ["today", "tomorrow"]}},
        },
    },
}


WEATHER_DECLARATION = {
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City"},
            "strict": {"type": "boolean"},
            "when": {"type": "string", "enum": ["today", "tomorrow"], "description": "day"},
            "tags": {
                "type": "array",
                "items": {"type": "object", "properties": {"k": {"type": "string"}}},
            },
        },
        "required": ["city"],
    },
}


def test_tools_become_function_declarations_without_rejected_keys() -> None:
    ping = {"name": "ping", "parameters": {"type": "object", "properties": {}}}
    sent = body(tools=[WEATHER, {"type": "function", "function": ping}])
    assert sent["tools"] == [{"functionDeclarations": [WEATHER_DECLARATION, {"name": "ping"}]}]


@pytest.mark.parametrize(
    ("choice", "config"),
    [
        ("auto", {"mode": "AUTO"}),
        ("required", {"mode": "ANY"}),
        ("none", {"mode": "NONE"}),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            {"mode": "ANY", "allowedFunctionNames": ["get_weather"]},
        ),
    ],
)
def test_tool_choice_becomes_function_calling_mode(choice: Any, config: dict[str, Any]) -> None:
    sent = body(tools=[WEATHER], tool_choice=choice)
    assert sent["toolConfig"] == {"functionCallingConfig": config}


def test_tool_choice_without_tools_is_dropped_and_unknown_names_rejected() -> None:
    assert "toolConfig" not in body(tool_choice="auto")
    with pytest.raises(InvalidRequestError) as info:
        body(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
    assert info.value.param == "tool_choice"


def test_recursive_and_dangling_refs_are_rejected() -> None:
    recursive = {
        "$ref": "#/$defs/N",
        "$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}}},
    }
    with pytest.raises(InvalidRequestError):
        to_gemini_schema(recursive, "p")
    with pytest.raises(InvalidRequestError) as info:
        to_gemini_schema({"$ref": "#/$defs/Missing"}, "p")
    assert info.value.param == "p"


def test_generation_config_carries_every_sampling_field() -> None:
    sent = body(
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        max_tokens=100,
        max_completion_tokens=50,
        stop=["END"],
        seed=7,
        n=2,
        presence_penalty=0.1,
        frequency_penalty=-0.2,
    )
    assert sent["generationConfig"] == {
        "temperature": 0.5,
        "topP": 0.9,
        "topK": 40,
        "maxOutputTokens": 50,
        "stopSequences": ["END"],
        "seed": 7,
        "candidateCount": 2,
        "presencePenalty": 0.1,
        "frequencyPenalty": -0.2,
    }
    assert body(max_tokens=10, stop="x")["generationConfig"] == {
        "maxOutputTokens": 10,
        "stopSequences": ["x"],
    }
    assert "generationConfig" not in body()


def test_json_modes_set_mime_type_and_schema() -> None:
    assert body(response_format={"type": "json_object"})["generationConfig"] == {
        "responseMimeType": "application/json"
    }
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "strict": True, "schema": schema}}
    assert body(response_format=fmt)["generationConfig"] == {
        "responseMimeType": "application/json",
        "responseSchema": {
            "type": "object",
            "properties": {"answer": {"type": "integer"}},
            "required": ["answer"],
        },
    }
    assert "generationConfig" not in body(response_format={"type": "text"})


# ---------------------------------------------------------------- responses
def test_text_parts_concatenate_and_thoughts_become_reasoning() -> None:
    out = respond(
        {
            "candidates": [
                {
                    "content": {
                        "role": "model",
                        "parts": [
                            {"text": "thinking...", "thought": True},
                            {"text": "Hel"},
                            {"text": "lo"},
                        ],
                    },
                    "finishReason": "STOP",
                    "index": 0,
                }
            ],
            "usageMetadata": {
                "promptTokenCount": 3,
                "candidatesTokenCount": 2,
                "thoughtsTokenCount": 4,
                "cachedContentTokenCount": 1,
            },
            "modelVersion": "gemini-2.0-flash-001",
            "responseId": "abc",
        }
    )
    assert (out.id, out.created, out.model) == ("abc", 5, "gemini-2.0-flash-001")
    message = AssistantMessage(content="Hello", reasoning_content="thinking...")
    assert out.choices == [Choice(index=0, message=message, finish_reason="stop")]
    assert out.usage == make_usage(3, 6, cached=1, reasoning=4)


def test_function_calls_become_tool_calls_with_deterministic_ids() -> None:
    out = respond(
        {
            "candidates": [
                {
                    "content": {
                        "parts": [
                            {"functionCall": {"name": "a", "args": {"x": 1}}},
                            {"functionCall": {"name": "b"}},
                            {"functionCall": {"name": "c", "args": {}, "id": "own-id"}},
                        ]
                    },
                    "finishReason": "STOP",
                }
            ]
        }
    )
    assert (out.id, out.model, out.usage) == ("chatcmpl-r1", "gemini-x", None)
    choice = out.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", None)
    assert calls_of(choice.message) == [
        ("call_0", "function", "a", '{"x":1}'),
        ("call_1", "function", "b", "{}"),
        ("own-id", "function", "c", "{}"),
    ]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("STOP", "stop"),
        ("MAX_TOKENS", "length"),
        ("SAFETY", "content_filter"),
        ("RECITATION", "content_filter"),
        ("BLOCKLIST", "content_filter"),
        ("PROHIBITED_CONTENT", "content_filter"),
        ("SPII", "content_filter"),
        ("OTHER", "stop"),
        ("MALFORMED_FUNCTION_CALL", "stop"),
        (None, "stop"),
    ],
)
def test_finish_reasons_map(raw: str | None, expected: str) -> None:
    assert finish_reason(raw, called_functions=False) == expected


def test_blocked_prompt_is_content_filter_with_empty_content() -> None:
    out = respond(
        {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 4}}
    )
    assert out.choices == [
        Choice(index=0, message=AssistantMessage(content=""), finish_reason="content_filter")
    ]
    assert out.usage == make_usage(4, 0)
    with pytest.raises(UpstreamMalformedError):
        respond({"usageMetadata": {"promptTokenCount": 4}})


def test_several_candidates_become_choices() -> None:
    out = respond(
        {
            "candidates": [
                {"content": {"parts": [{"text": "b"}]}, "finishReason": "MAX_TOKENS", "index": 1},
                {"content": {"parts": [{"text": "a"}]}, "finishReason": "STOP", "index": 0},
            ]
        }
    )
    assert [(c.index, c.message.content, c.finish_reason) for c in out.choices] == [
        (0, "a", "stop"),
        (1, "b", "length"),
    ]


# ---------------------------------------------------------------- streaming
def run_stream(events: list[dict[str, Any]], include_usage: bool) -> list[dict[str, Any]]:
    conv = StreamConverter(
        fallback_id="chatcmpl-r1",
        model="gemini-x",
        created=5,
        include_usage=include_usage,
        provider="g",
    )
    chunks: list[ChatChunk] = []
    for event in events:
        chunks += conv.feed(gemini(event))
    chunks += conv.close()
    return [msgspec.to_builtins(c) for c in chunks]


def deltas(chunks: list[dict[str, Any]]) -> list[Any]:
    return [
        (c["choices"][0]["delta"], c["choices"][0]["finish_reason"]) if c["choices"] else c["usage"]
        for c in chunks
    ]


def text_event(text: str, finish: str | None = None, index: int = 0) -> dict[str, Any]:
    candidate: dict[str, Any] = {
        "content": {"parts": [{"text": text}], "role": "model"},
        "index": index,
    }
    if finish:
        candidate["finishReason"] = finish
    return {
        "candidates": [candidate],
        "modelVersion": "v-001",
        "responseId": "rid",
        "usageMetadata": {"promptTokenCount": 11, "candidatesTokenCount": 5 if finish else 1},
    }


def test_text_stream_follows_openai_chunk_order() -> None:
    events = [text_event("Hello"), text_event(" there"), text_event("", "STOP")]
    chunks = run_stream(events, include_usage=True)
    assert {(c["id"], c["model"], c["created"]) for c in chunks} == {("rid", "v-001", 5)}
    assert deltas(chunks) == [
        ({"role": "assistant", "content": ""}, None),
        ({"content": "Hello"}, None),
        ({"content": " there"}, None),
        ({}, "stop"),
        {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
    ]
    assert len(run_stream(events, include_usage=False)) == 4


def test_stream_tool_call_is_a_header_and_one_arguments_delta() -> None:
    event = {
        "candidates": [
            {
                "content": {
                    "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}]
                },
                "finishReason": "STOP",
            }
        ]
    }
    assert deltas(run_stream([event], include_usage=False)) == [
        ({"role": "assistant", "content": ""}, None),
        (
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            },
            None,
        ),
        ({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":"Paris"}'}}]}, None),
        ({}, "tool_calls"),
    ]


def test_stream_without_finish_reason_is_truncated() -> None:
    conv = StreamConverter(fallback_id="x", model="m", created=0, include_usage=False, provider="g")
    assert len(conv.feed(gemini(text_event("Hello")))) == 2
    with pytest.raises(UpstreamMalformedError, match="finishReason"):
        conv.close()


def test_stream_blocked_prompt_and_second_candidate() -> None:
    blocked = run_stream([{"promptFeedback": {"blockReason": "OTHER"}}], include_usage=False)
    assert deltas(blocked) == [({"role": "assistant", "content": ""}, None), ({}, "content_filter")]
    two = run_stream(
        [
            text_event("a", index=0),
            text_event("b", "STOP", index=1),
            text_event("", "SAFETY", index=0),
        ],
        include_usage=False,
    )
    assert [(c["choices"][0]["index"], c["choices"][0]["finish_reason"]) for c in two] == [
        (0, None),
        (0, None),
        (1, None),
        (1, None),
        (1, "stop"),
        (0, "content_filter"),
    ]


# ---------------------------------------------------------------- errors, embeddings
def test_error_bodies_yield_message_code_reason_and_retry_delay() -> None:
    facts = read_error(
        msgspec.json.encode(
            {
                "error": {
                    "code": 429,
                    "message": "quota",
                    "status": "RESOURCE_EXHAUSTED",
                    "details": [
                        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7.5s"}
                    ],
                }
            }
        )
    )
    assert (facts.message, facts.code, facts.reason, facts.retry_delay) == ("quota", 429, None, 7.5)
    facts = read_error(
        b'{"error": {"message": "m", "status": "UNAVAILABLE", "details": '
        b'[{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "R"}]}}'
    )
    assert (facts.code, facts.reason, facts.retry_delay) == (503, "R", None)
    with pytest.raises(msgspec.DecodeError):
        read_error(b"<html>")


def test_embedding_requests_single_and_batch() -> None:
    one = msgspec.to_builtins(embed_request(["a"], "emb", 4))
    assert one == {"content": {"parts": [{"text": "a"}]}, "outputDimensionality": 4}
    batch = msgspec.to_builtins(embed_request(["a", "b"], "emb", None))
    assert batch == {
        "requests": [
            {"content": {"parts": [{"text": "a"}]}, "model": "models/emb"},
            {"content": {"parts": [{"text": "b"}]}, "model": "models/emb"},
        ]
    }


def test_embedding_body_float_and_base64() -> None:
    vectors = [[0.5, -1.25], [2.0, 0.0]]
    plain = msgspec.json.decode(embedding_body(vectors, "emb", None), type=EmbeddingResponse)
    assert [item.embedding for item in plain.data] == vectors
    assert (plain.model, plain.usage.prompt_tokens, plain.object) == ("emb", 0, "list")
    packed = msgspec.json.decode(embedding_body(vectors, "emb", "base64"), type=EmbeddingResponse)
    raw = base64.b64decode(str(packed.data[1].embedding))
    assert list(struct.unpack("<2f", raw)) == [2.0, 0.0]


# ---------------------------------------------------------------- properties
turn = st.tuples(st.sampled_from(["user", "assistant"]), st.text(min_size=1, max_size=8))


@given(st.lists(turn, min_size=1, max_size=12))
def test_merged_turns_alternate_and_keep_every_text_in_order(turns: list[tuple[str, str]]) -> None:
    messages = [{"role": role, "content": text} for role, text in turns]
    contents = body(messages=messages)["contents"]
    roles = [c["role"] for c in contents]
    assert all(a != b for a, b in itertools.pairwise(roles))
    assert [p["text"] for c in contents for p in c["parts"]] == [text for _, text in turns]
    expected_roles = [{"user": "user", "assistant": "model"}[r] for r, _ in turns]
    assert roles == [
        r for i, r in enumerate(expected_roles) if i == 0 or r != expected_roles[i - 1]
    ]


names = st.sampled_from(["strict", "a", "additionalProperties", "$schema", "type"])
schemas = st.recursive(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer"])}),
    lambda inner: st.fixed_dictionaries(
        {"type": st.just("object"), "properties": st.dictionaries(names, inner, max_size=3)},
        optional={
            "additionalProperties": st.booleans(),
            "strict": st.booleans(),
            "$schema": st.just("x"),
            "items": inner,
            "anyOf": st.lists(inner, max_size=2),
        },
    ),
    max_leaves=8,
)


def schema_keys(node: Any) -> set[str]:
    if isinstance(node, list):
        return set().union(*(schema_keys(n) for n in node)) if node else set()
    if not isinstance(node, dict):
        return set()
    keys = set(node)
    for key, value in node.items():
        children = value.values() if key == "properties" else [value]
        keys |= set().union(*(schema_keys(c) for c in children)) if children else set()
    return keys


@given(schemas)
def test_schema_cleaning_drops_rejected_keywords_only(schema: dict[str, Any]) -> None:
    cleaned = to_gemini_schema(schema, "p")
    assert not schema_keys(cleaned) & UNSUPPORTED_KEYS
    assert set(cleaned.get("properties", {})) == set(schema.get("properties", {}))
    assert to_gemini_schema(cleaned, "p") == cleaned
