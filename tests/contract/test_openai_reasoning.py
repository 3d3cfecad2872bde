"""Reasoning through the OpenAI-compatible adapter, against the exact answers of DeepSeek
(``reasoning_content``), current vLLM / OpenRouter (``reasoning``) and OpenAI
(``completion_tokens_details.reasoning_tokens``), served by an in-process httpx transport:
``reasoning_effort`` goes upstream untouched, reasoning text and token counts reach the
canonical types, and the raw bytes stay as the upstream sent them."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from core.config import OpenAIProviderConfig
from core.protocols import CallContext, Timeouts
from core.wire import ChatRequest, Message
from providers.openai import OpenAIProvider

pytestmark = pytest.mark.anyio
HELLO = [Message("user", "What is 2 + 2?")]


def completion(message: dict[str, Any], usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-r",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **message},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": usage or {"prompt_tokens": 9, "completion_tokens": 30, "total_tokens": 39},
    }


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-r",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


class Upstream:
    """Answers every call with ``body`` (JSON) or ``events`` (SSE) and records requests."""

    def __init__(
        self, body: dict[str, Any] | None = None, events: list[dict[str, Any]] | None = None
    ) -> None:
        self.body, self.events = body, events
        self.sent: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(json.loads(request.content))
        if self.events is None:
            return httpx.Response(200, json=self.body)
        sse = "".join(f"data: {json.dumps(e)}\n\n" for e in self.events) + "data: [DONE]\n\n"
        return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})


async def chat(upstream: Upstream, raw: dict[str, Any]) -> Any:
    ctx = CallContext(
        request_id="req_1",
        upstream_model="m",
        raw_body=json.dumps(raw).encode(),
        timeouts=Timeouts(total=5, first_token=5),
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(upstream)) as client:
        provider = OpenAIProvider("oa", client, OpenAIProviderConfig(base_url="http://u/v1"), "k")
        req = ChatRequest(
            "alias",
            HELLO,
            reasoning_effort=raw.get("reasoning_effort"),
            stream=bool(raw.get("stream")),
        )
        if req.stream:
            return [part async for part in provider.stream_chat(req, ctx)]
        return await provider.chat(req, ctx)


async def test_effort_is_forwarded_and_deepseek_reasoning_content_decodes() -> None:
    body = completion(
        {"content": "4", "reasoning_content": "Adding two and two gives four."},
        {
            "prompt_tokens": 9,
            "completion_tokens": 30,
            "total_tokens": 39,
            "completion_tokens_details": {"reasoning_tokens": 24},
            "prompt_tokens_details": {"cached_tokens": 0},
        },
    )
    upstream = Upstream(body)
    raw = {
        "model": "alias",
        "messages": [{"role": "user", "content": "What is 2 + 2?"}],
        "reasoning_effort": "high",
    }
    result = await chat(upstream, raw)
    assert upstream.sent[0]["reasoning_effort"] == "high"
    message = result.response.choices[0].message
    assert (message.content, message.reasoning_content) == ("4", "Adding two and two gives four.")
    assert result.response.usage.reasoning_tokens == 24
    assert result.response.usage.completion_tokens == 30  # reasoning is inside, not added
    assert json.loads(result.raw) == body


async def test_vllm_and_openrouter_reasoning_field_becomes_reasoning_content() -> None:
    body = completion({"content": "4", "reasoning": "Two plus two.", "reasoning_content": None})
    result = await chat(Upstream(body), {"model": "alias", "messages": []})
    assert result.response.choices[0].message.reasoning_content == "Two plus two."
    assert json.loads(result.raw)["choices"][0]["message"]["reasoning"] == "Two plus two."


async def test_a_reasoning_field_of_another_shape_is_ignored_not_fatal() -> None:
    body = completion({"content": "4", "reasoning": {"effort": "low"}})
    result = await chat(Upstream(body), {"model": "alias", "messages": []})
    message = result.response.choices[0].message
    assert (message.content, message.reasoning_content) == ("4", None)


async def test_streamed_reasoning_in_either_field_reaches_the_delta() -> None:
    events = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "Two"}),
        chunk({"reasoning": " plus two."}),
        chunk({"content": "4"}),
        chunk({}, "stop"),
        {
            **chunk({}),
            "choices": [],
            "usage": {
                "prompt_tokens": 9,
                "completion_tokens": 7,
                "total_tokens": 16,
                "completion_tokens_details": {"reasoning_tokens": 5},
            },
        },
    ]
    parts = await chat(
        Upstream(events=events),
        {"model": "alias", "messages": [], "stream": True, "reasoning_effort": "low"},
    )
    reasoning = [p.chunk.choices[0].delta.reasoning_content for p in parts if p.chunk.choices]
    assert [r for r in reasoning if r] == ["Two", " plus two."]
    assert parts[-1].chunk.usage.reasoning_tokens == 5
    assert json.loads(parts[2].raw)["choices"][0]["delta"] == {"reasoning": " plus two."}
