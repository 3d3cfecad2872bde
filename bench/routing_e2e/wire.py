"""OpenAI wire format for the fake upstreams (pure builders of bytes).

Chunks are ``chat.completion.chunk`` objects in SSE framing (``data: {json}\\n\\n``), a
usage-only chunk (``choices: []``) when the request asked for it, then ``data: [DONE]``.
Errors are ``{"error": {"message", "type", "param", "code"}}``. Token text: each token is
four characters (``"tok "``), so the gateway's characters/4 estimate matches the count.
"""

from __future__ import annotations

import json
import time
from typing import Any

TOKEN_TEXT = "tok "
CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4


def prompt_tokens(body: dict[str, Any]) -> int:
    """The gateway's own estimate (gateway/request/routing_view.py): characters / 4 of the
    text content, plus 4 per message."""
    chars = 0
    messages = body.get("messages") or []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(p.get("text", "")) for p in content if isinstance(p, dict))
    return chars // CHARS_PER_TOKEN + TOKENS_PER_MESSAGE * len(messages)


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _chunk(
    rid: str, model: str, choices: list[dict[str, Any]], extra: dict[str, Any] | None = None
) -> bytes:
    payload: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "fp_bench",
        "choices": choices,
    }
    if extra:
        payload.update(extra)
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def delta_chunk(rid: str, model: str, content: str, *, role: bool = False) -> bytes:
    """One content delta (the first one also carries ``role: assistant``)."""
    delta: dict[str, Any] = (
        {"role": "assistant", "content": content} if role else {"content": content}
    )
    return _chunk(
        rid, model, [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]
    )


def finish_chunk(rid: str, model: str, reason: str) -> bytes:
    return _chunk(
        rid, model, [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}]
    )


def usage_chunk(rid: str, model: str, prompt: int, completion: int) -> bytes:
    return _chunk(rid, model, [], {"usage": usage(prompt, completion)})


DONE = b"data: [DONE]\n\n"


def completion(rid: str, model: str, text: str, reason: str, prompt: int, done: int) -> bytes:
    """A whole ``chat.completion`` object with usage."""
    return json.dumps(
        {
            "id": rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": "fp_bench",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": reason,
                }
            ],
            "usage": usage(prompt, done),
        }
    ).encode()


def error(message: str, kind: str, code: str | None = None, param: str | None = None) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": kind, "param": param, "code": code}}
    ).encode()


def models(names: list[str]) -> bytes:
    data = [
        {"id": n, "object": "model", "created": 1_700_000_000, "owned_by": "bench"} for n in names
    ]
    return json.dumps({"object": "list", "data": data}).encode()


def metrics_page(
    model: str, running: int, waiting: int, kv_usage: float, ttft_sum: float, ttft_count: int
) -> bytes:
    """vLLM V1 Prometheus gauges the gateway's capacity monitor parses
    (local_tier/vllm/metrics.py): running, waiting, KV use, prefix-cache counters,
    ``cache_config_info`` and the TTFT histogram's sum and count."""
    labels = f'engine="0",model_name="{model}"'
    blocks = 65_536 // 16
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {float(running)}",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {float(waiting)}",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} {kv_usage}",
        "# TYPE vllm:prefix_cache_queries counter",
        f"vllm:prefix_cache_queries_total{{{labels}}} 0.0",
        "# TYPE vllm:prefix_cache_hits counter",
        f"vllm:prefix_cache_hits_total{{{labels}}} 0.0",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="16",engine="0",num_gpu_blocks="{blocks}"}} 1.0',
        "# TYPE vllm:time_to_first_token_seconds histogram",
        f'vllm:time_to_first_token_seconds_bucket{{{labels},le="+Inf"}} {float(ttft_count)}',
        f"vllm:time_to_first_token_seconds_count{{{labels}}} {float(ttft_count)}",
        f"vllm:time_to_first_token_seconds_sum{{{labels}}} {ttft_sum}",
    ]
    return ("\n".join(lines) + "\n").encode()
