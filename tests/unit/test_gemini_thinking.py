"""Reasoning on Gemini, both ways: ``reasoning_effort`` -> ``generationConfig.thinkingConfig``;
``thought: true`` parts -> ``reasoning_content``; ``thoughtsTokenCount`` -> completion tokens
and ``completion_tokens_details.reasoning_tokens``."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from core.config_tenants import Price
from core.wire import ChatChunk, ChatRequest
from policies.pricing import cost_usd
from providers.gemini.convert import to_gemini_request
from providers.gemini.response import to_chat_response
from providers.gemini.stream import StreamConverter
from providers.gemini.wire import encoder, response_decoder


def body(**fields: Any) -> dict[str, Any]:
    """The JSON Gemini would receive for a chat request with ``fields``."""
    fields.setdefault("model", "gemini-x")
    fields.setdefault("messages", [{"role": "user", "content": "hi"}])
    req = msgspec.convert(fields, ChatRequest)
    result: dict[str, Any] = msgspec.json.decode(encoder.encode(to_gemini_request(req)))
    return result


# ---------------------------------------------------------------- requests
@pytest.mark.parametrize(
    ("effort", "budget"),
    [
        ("minimal", 512),
        ("low", 1024),
        ("medium", 8192),
        ("high", 24576),
    ],
)
def test_effort_becomes_a_thinking_budget_with_thought_summaries(effort: str, budget: int) -> None:
    assert body(reasoning_effort=effort)["generationConfig"] == {
        "thinkingConfig": {"thinkingBudget": budget, "includeThoughts": True}
    }


def test_none_turns_thinking_off_and_no_effort_sends_nothing() -> None:
    assert body(reasoning_effort="none")["generationConfig"] == {
        "thinkingConfig": {"thinkingBudget": 0}
    }
    assert "generationConfig" not in body()


def test_client_limit_is_sent_unchanged_next_to_the_budget() -> None:
    # maxOutputTokens already counts thinking, as OpenAI's limits count reasoning tokens
    assert body(reasoning_effort="high", max_completion_tokens=30000, temperature=0.2)[
        "generationConfig"
    ] == {
        "temperature": 0.2,
        "maxOutputTokens": 30000,
        "thinkingConfig": {"thinkingBudget": 24576, "includeThoughts": True},
    }


# ---------------------------------------------------------------- responses
THOUGHTFUL = {
    "candidates": [
        {
            "content": {
                "role": "model",
                "parts": [
                    {"text": "**Adding numbers**\n\nTwo plus two is four.", "thought": True},
                    {"text": "4", "thoughtSignature": "CiQB0e2Kb7xQ"},
                ],
            },
            "finishReason": "STOP",
            "index": 0,
        }
    ],
    "usageMetadata": {
        "promptTokenCount": 7,
        "candidatesTokenCount": 1,
        "thoughtsTokenCount": 38,
        "totalTokenCount": 46,
    },
    "modelVersion": "gemini-2.5-flash",
    "responseId": "rid-1",
}


def test_thought_parts_become_reasoning_and_thoughts_count_as_completion() -> None:
    resp = response_decoder.decode(msgspec.json.encode(THOUGHTFUL))
    out = msgspec.to_builtins(
        to_chat_response(resp, model="gemini-x", fallback_id="x", created=1, provider="g")
    )
    assert out["choices"][0]["message"] == {
        "role": "assistant",
        "content": "4",
        "reasoning_content": "**Adding numbers**\n\nTwo plus two is four.",
    }
    assert out["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 39,
        "total_tokens": 46,
        "completion_tokens_details": {"reasoning_tokens": 38},
    }


def test_cost_bills_thoughts_once_as_output() -> None:
    resp = response_decoder.decode(msgspec.json.encode(THOUGHTFUL))
    usage = to_chat_response(resp, model="g", fallback_id="x", created=1, provider="g").usage
    assert usage is not None and usage.reasoning_tokens == 38
    price = Price(input_per_mtok=1.0, output_per_mtok=10.0)
    assert (
        cost_usd(price, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
        == (7 * 1.0 + 39 * 10.0) / 1e6
    )


def test_stream_thoughts_come_as_reasoning_deltas_before_the_answer() -> None:
    def event(
        parts: list[dict[str, Any]],
        finish: str | None = None,
        thoughts: int = 0,
        candidates: int = 0,
    ) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish:
            candidate["finishReason"] = finish
        usage = {
            "promptTokenCount": 7,
            "candidatesTokenCount": candidates,
            "thoughtsTokenCount": thoughts,
        }
        return {"candidates": [candidate], "usageMetadata": usage, "responseId": "rid"}

    events = [
        event([{"text": "Thinking about it.", "thought": True}], thoughts=38),
        event([{"text": "4"}], thoughts=38, candidates=1),
        event([{"text": ""}], "STOP", thoughts=38, candidates=1),
    ]
    conv = StreamConverter(fallback_id="x", model="g", created=1, include_usage=True, provider="g")
    chunks: list[ChatChunk] = []
    for payload in events:
        chunks += conv.feed(response_decoder.decode(msgspec.json.encode(payload)))
    chunks += conv.close()
    wire = [msgspec.to_builtins(c) for c in chunks]
    assert [c["choices"][0]["delta"] for c in wire[:-1]] == [
        {"role": "assistant", "content": ""},
        {"reasoning_content": "Thinking about it."},
        {"content": "4"},
        {},
    ]
    assert wire[-1]["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 39,
        "total_tokens": 46,
        "completion_tokens_details": {"reasoning_tokens": 38},
    }
