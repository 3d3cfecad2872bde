"""Pure tests of the Anthropic stream converter: Anthropic SSE events -> OpenAI chunks."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import (
    ProviderError,
    UpstreamBadRequestError,
    UpstreamMalformedError,
    UpstreamRateLimitedError,
    UpstreamServerError,
)
from core.wire import ChatChunk
from providers.anthropic.stream import StreamConverter


def ev(name: str, **data: Any) -> tuple[str, str]:
    return name, json.dumps({"type": name, **data})


START = ev(
    "message_start",
    message={
        "id": "msg_s",
        "type": "message",
        "role": "assistant",
        "model": "claude-x-2025",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 1},
    },
)


def text_block(index: int, *pieces: str) -> list[tuple[str, str]]:
    return [
        ev("content_block_start", index=index, content_block={"type": "text", "text": ""}),
        *[
            ev("content_block_delta", index=index, delta={"type": "text_delta", "text": p})
            for p in pieces
        ],
        ev("content_block_stop", index=index),
    ]


def tool_block(index: int, tool_id: str, name: str, *pieces: str) -> list[tuple[str, str]]:
    opening = {"type": "tool_use", "id": tool_id, "name": name, "input": {}}
    return [
        ev("content_block_start", index=index, content_block=opening),
        *[
            ev(
                "content_block_delta",
                index=index,
                delta={"type": "input_json_delta", "partial_json": p},
            )
            for p in pieces
        ],
        ev("content_block_stop", index=index),
    ]


def end(stop: str, **usage: int) -> list[tuple[str, str]]:
    return [
        ev(
            "message_delta",
            delta={"stop_reason": stop, "stop_sequence": None},
            usage={"output_tokens": 5, **usage},
        ),
        ev("message_stop"),
    ]


def chunks_for(
    events: list[tuple[str, str]], *, usage: bool = False, json_tool: str | None = None
) -> list[ChatChunk]:
    conv = StreamConverter(provider="claude", created=9, include_usage=usage, json_tool=json_tool)
    chunks: list[ChatChunk] = []
    for name, data in events:
        chunks.extend(conv.feed(name, data))
    conv.finish()
    return chunks


def run(
    events: list[tuple[str, str]], *, usage: bool = False, json_tool: str | None = None
) -> list[dict[str, Any]]:
    """The chunks as builtins (fields equal to their defaults are left out)."""
    chunks = chunks_for(events, usage=usage, json_tool=json_tool)
    return [msgspec.to_builtins(c) for c in chunks]


def deltas(chunks: list[dict[str, Any]]) -> list[Any]:
    return [
        (c["choices"][0]["delta"], c["choices"][0]["finish_reason"]) if c["choices"] else c["usage"]
        for c in chunks
    ]


def test_text_stream_is_openais_exact_sequence() -> None:
    events = [START, ev("ping"), *text_block(0, "Hello", " there"), *end("end_turn")]
    chunks = run(events)
    assert deltas(chunks) == [
        ({"role": "assistant", "content": ""}, None),
        ({"content": "Hello"}, None),
        ({"content": " there"}, None),
        ({}, "stop"),
    ]
    encoded = [msgspec.json.decode(msgspec.json.encode(c)) for c in chunks_for(events)]
    assert {(c["id"], c["model"], c["created"], c["object"]) for c in encoded} == {
        ("msg_s", "claude-x-2025", 9, "chat.completion.chunk")
    }


def test_usage_chunk_comes_last_only_when_asked() -> None:
    events = [START, *text_block(0, "x"), *end("max_tokens", cache_read_input_tokens=4)]
    chunks = run(events, usage=True)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 15,
        "completion_tokens": 5,
        "total_tokens": 20,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    assert all("usage" not in c for c in run(events))


def test_tool_calls_are_indexed_from_zero_in_block_order() -> None:
    events = [
        START,
        *text_block(0, "Let me check."),
        *tool_block(1, "toolu_a", "get_weather", "", '{"city":', ' "Paris"}'),
        *tool_block(2, "toolu_b", "get_time", "{}"),
        *end("tool_use"),
    ]
    assert deltas(run(events))[1:] == [
        ({"content": "Let me check."}, None),
        (
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "toolu_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            },
            None,
        ),
        ({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}, None),
        ({"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}]}, None),
        (
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "toolu_b",
                        "type": "function",
                        "function": {"name": "get_time", "arguments": ""},
                    }
                ]
            },
            None,
        ),
        ({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}, None),
        ({}, "tool_calls"),
    ]


def test_json_schema_tool_streams_as_text() -> None:
    events = [
        START,
        *tool_block(0, "t", "answer_schema", "", '{"answer":', " 42}"),
        *end("tool_use"),
    ]
    assert deltas(run(events, json_tool="answer_schema")) == [
        ({"role": "assistant", "content": ""}, None),
        ({"content": '{"answer":'}, None),
        ({"content": " 42}"}, None),
        ({}, "stop"),
    ]


def thinking_block(
    index: int, *pieces: str, signature: str = "EqQBCgIYAhIM"
) -> list[tuple[str, str]]:
    """Anthropic's exact thinking block: an empty start, thinking_delta pieces, then one
    signature_delta before the stop."""
    return [
        ev("content_block_start", index=index, content_block={"type": "thinking", "thinking": ""}),
        *[
            ev("content_block_delta", index=index, delta={"type": "thinking_delta", "thinking": p})
            for p in pieces
        ],
        ev(
            "content_block_delta",
            index=index,
            delta={"type": "signature_delta", "signature": signature},
        ),
        ev("content_block_stop", index=index),
    ]


def test_thinking_streams_as_reasoning_content_and_signatures_are_skipped() -> None:
    events = [
        START,
        *thinking_block(0, "Let me think", " step by step."),
        *text_block(1, "Hi"),
        *end("end_turn"),
    ]
    assert deltas(run(events))[1:] == [
        ({"reasoning_content": "Let me think"}, None),
        ({"reasoning_content": " step by step."}, None),
        ({"content": "Hi"}, None),
        ({}, "stop"),
    ]


def test_later_thinking_blocks_start_with_a_blank_line() -> None:
    # interleaved thinking: thinking, tool call, thinking again (joined like the JSON answer)
    events = [
        START,
        *thinking_block(0, "first"),
        *tool_block(1, "toolu_a", "get_weather", "{}"),
        *thinking_block(2, "second"),
        *text_block(3, "Done"),
        *end("end_turn"),
    ]
    reasoning = [d["reasoning_content"] for d, _ in deltas(run(events)) if "reasoning_content" in d]
    assert reasoning == ["first", "\n\n", "second"]  # the separator comes at the block start


def test_redacted_thinking_blocks_are_skipped() -> None:
    redacted = [
        ev(
            "content_block_start",
            index=0,
            content_block={"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
        ),
        ev("content_block_stop", index=0),
    ]
    chunks = run([START, *redacted, *text_block(1, "Hi"), *end("end_turn")])
    assert deltas(chunks)[1:] == [({"content": "Hi"}, None), ({}, "stop")]


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        ("overloaded_error", UpstreamServerError),
        ("rate_limit_error", UpstreamRateLimitedError),
        ("invalid_request_error", UpstreamBadRequestError),
        ("api_error", UpstreamServerError),
        ("something_new", UpstreamServerError),
    ],
)
def test_error_event_maps_to_provider_error(kind: str, cls: type[ProviderError]) -> None:
    conv = StreamConverter(provider="claude", created=0, include_usage=False, json_tool=None)
    conv.feed(*START)
    with pytest.raises(ProviderError) as info:
        conv.feed(*ev("error", error={"type": kind, "message": "Boom"}))
    assert type(info.value) is cls
    assert "Boom" in info.value.message and info.value.provider == "claude"


@pytest.mark.parametrize(
    "events",
    [
        [START, *text_block(0, "x")],  # no message_stop
        [ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "x"})],
        [START, ev("content_block_delta", index=3, delta={"type": "text_delta", "text": "x"})],
        [START, ("content_block_start", '{"type": "content_block_st')],
        [START, START],
    ],
)
def test_broken_streams_are_malformed(events: list[tuple[str, str]]) -> None:
    with pytest.raises(UpstreamMalformedError):
        run(events)


@given(st.lists(st.text(min_size=1), max_size=6))
def test_streamed_text_pieces_arrive_whole_and_in_order(pieces: list[str]) -> None:
    chunks = run([START, *text_block(0, *pieces), *end("end_turn")])
    contents = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
    assert contents == pieces
