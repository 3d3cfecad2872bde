"""Reasoning on Anthropic, both ways: ``reasoning_effort`` -> ``thinking`` in the request body,
``thinking`` blocks -> ``reasoning_content`` in the answer (streams: test_anthropic_stream.py)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.wire import (
    ChatRequest,
    FunctionCall,
    FunctionDef,
    JSONSchemaSpec,
    Message,
    NamedToolChoice,
    ResponseFormat,
    Tool,
    ToolCall,
    ToolChoiceFunction,
)
from providers.anthropic import convert, wire
from providers.anthropic.thinking import BUDGETS, MIN_BUDGET, plan_tokens

USER = Message("user", "Hi")
WEATHER = Tool(FunctionDef("get_weather", "Weather by city", {"type": "object"}))


def body(*messages: Message, default_max: int = 4096, **options: Any) -> dict[str, Any]:
    """The exact JSON Anthropic would receive for a request with ``options``."""
    req = ChatRequest(model="alias", messages=list(messages or [USER]), **options)
    built = convert.build_request(req, "claude-x", default_max, stream=False)
    decoded: dict[str, Any] = json.loads(wire.encoder.encode(built))
    return decoded


# ---------------------------------------------------------------- requests
@pytest.mark.parametrize(
    ("effort", "budget"),
    [
        ("minimal", 1024),
        ("low", 1024),
        ("medium", 4096),
        ("high", 16384),
    ],
)
def test_effort_becomes_a_thinking_budget_on_top_of_the_default(effort: str, budget: int) -> None:
    sent = body(reasoning_effort=effort, default_max=4096)
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": budget}
    assert sent["max_tokens"] == 4096 + budget


@pytest.mark.parametrize("effort", [None, "none"])
def test_no_effort_or_none_sends_no_thinking(effort: str | None) -> None:
    sent = body(reasoning_effort=effort, temperature=0.2, default_max=4096)
    assert "thinking" not in sent
    assert (sent["max_tokens"], sent["temperature"]) == (4096, 0.2)


def test_client_limit_caps_thinking_and_answer_together() -> None:
    sent = body(reasoning_effort="high", max_completion_tokens=10000)
    assert sent["max_tokens"] == 10000
    assert sent["thinking"]["budget_tokens"] == 5000  # half: the answer keeps the rest
    roomy = body(reasoning_effort="medium", max_tokens=40000)
    assert (roomy["max_tokens"], roomy["thinking"]["budget_tokens"]) == (40000, 4096)


def test_small_client_limit_is_raised_just_enough_for_the_minimum_budget() -> None:
    sent = body(reasoning_effort="low", max_tokens=100)
    assert sent["thinking"]["budget_tokens"] == MIN_BUDGET
    assert sent["max_tokens"] == MIN_BUDGET + 1


@given(
    st.sampled_from(sorted(BUDGETS)), st.none() | st.integers(1, 200_000), st.integers(1, 64_000)
)
def test_planned_budget_is_always_valid_for_anthropic(
    effort: Any, limit: int | None, default: int
) -> None:
    budget, max_tokens = plan_tokens(BUDGETS[effort], limit, default)
    assert MIN_BUDGET <= budget <= BUDGETS[effort]
    assert budget < max_tokens
    if limit is not None and limit > MIN_BUDGET:
        assert max_tokens == limit  # a limit that fits thinking is never exceeded


def test_thinking_drops_sampling_knobs_anthropic_forbids_with_it() -> None:
    sent = body(reasoning_effort="low", temperature=0.3, top_k=40, top_p=0.5)
    assert "temperature" not in sent and "top_k" not in sent
    assert sent["top_p"] == 0.95
    assert body(reasoning_effort="low", top_p=0.99)["top_p"] == 0.99


def test_forced_tool_choice_leaves_thinking_off() -> None:
    required = body(reasoning_effort="high", tools=[WEATHER], tool_choice="required")
    assert "thinking" not in required and required["tool_choice"]["type"] == "any"
    named = NamedToolChoice(ToolChoiceFunction("get_weather"))
    assert "thinking" not in body(reasoning_effort="high", tools=[WEATHER], tool_choice=named)
    schema = ResponseFormat("json_schema", JSONSchemaSpec("answer", {"type": "object"}))
    assert "thinking" not in body(reasoning_effort="high", response_format=schema)
    auto = body(reasoning_effort="high", tools=[WEATHER], tool_choice="auto")
    assert auto["thinking"]["type"] == "enabled"


def test_open_tool_loop_continues_without_thinking() -> None:
    call = ToolCall("toolu_1", FunctionCall("get_weather", '{"city": "Paris"}'))
    loop = [
        USER,
        Message("assistant", tool_calls=[call]),
        Message("tool", "sunny", tool_call_id="toolu_1"),
    ]
    assert "thinking" not in body(*loop, reasoning_effort="high", tools=[WEATHER])
    closed = [*loop, Message("assistant", "It is sunny."), Message("user", "And tomorrow?")]
    assert body(*closed, reasoning_effort="high", tools=[WEATHER])["thinking"] == {
        "type": "enabled",
        "budget_tokens": 16384,
    }


# ---------------------------------------------------------------- responses
def message(blocks: list[dict[str, Any]], stop: str = "end_turn") -> wire.MessagesResponse:
    raw = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x-2025",
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 120},
    }
    return wire.response_decoder.decode(json.dumps(raw))


def respond(msg: wire.MessagesResponse) -> dict[str, Any]:
    out = convert.to_chat_response(msg, created=1, json_tool=None, provider="claude")
    decoded: dict[str, Any] = msgspec.to_builtins(out)
    return decoded


def test_thinking_block_becomes_reasoning_content() -> None:
    out = respond(
        message(
            [
                {"type": "thinking", "thinking": "2 + 2 is 4.", "signature": "EqQBCgIYAhIM"},
                {"type": "text", "text": "4"},
            ]
        )
    )
    assert out["choices"][0]["message"] == {
        "role": "assistant",
        "content": "4",
        "reasoning_content": "2 + 2 is 4.",
    }
    # Anthropic reports thinking inside output_tokens only: no invented breakdown
    assert out["usage"] == {"prompt_tokens": 11, "completion_tokens": 120, "total_tokens": 131}


def test_several_thinking_blocks_join_and_redacted_thinking_is_dropped() -> None:
    out = respond(
        message(
            [
                {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
                {"type": "thinking", "thinking": "first", "signature": "a"},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
                {"type": "thinking", "thinking": "second", "signature": "b"},
            ],
            stop="tool_use",
        )
    )
    msg = out["choices"][0]["message"]
    assert msg["reasoning_content"] == "first\n\nsecond"
    assert "content" not in msg and len(msg["tool_calls"]) == 1


def test_answer_without_thinking_has_no_reasoning_field() -> None:
    out = respond(message([{"type": "text", "text": "Hi"}]))
    assert "reasoning_content" not in out["choices"][0]["message"]
