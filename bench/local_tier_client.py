"""The client side of bench/local_tier.py: timed streaming chat calls and prompts of exact
token counts. Loopback only; nothing here starts or stops servers."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import aconnect_sse

# Short, common words: each is one BPE token after a space, so prompt length moves one token
# per word while the builder converges on the exact count.
_WORDS_TEXT = (
    "the cat dog sun red blue tree house water city road book"
    " time day night light green small big old new good man car"
)
WORDS = tuple(_WORDS_TEXT.split())


@dataclass
class StreamResult:
    """One streamed chat completion, timed on the client."""

    ttft: float | None = None
    decode_time: float = 0.0  # first content chunk -> last content chunk
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    started: float = 0.0
    ended: float = 0.0


@dataclass
class Target:
    name: str
    base_url: str
    pid: int | None = None
    model: str = ""
    figures: dict[str, float | None] = field(default_factory=dict)


async def stream_chat(
    client: httpx.AsyncClient,
    target: Target,
    messages: list[dict[str, str]],
    max_tokens: int,
    res: StreamResult | None = None,
) -> StreamResult:
    """POST a streaming chat completion and time its chunks into ``res`` (filled as chunks
    arrive, so a request cut off by a deadline still counts what it streamed)."""
    body = {
        "model": target.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    res = res or StreamResult()
    res.started = time.perf_counter()
    url = f"{target.base_url}/v1/chat/completions"
    async with aconnect_sse(client, "POST", url, json=body) as events:
        if events.response.status_code != 200:
            await events.response.aread()
            raise RuntimeError(f"{url}: {events.response.status_code} {events.response.text}")
        async for sse in events.aiter_sse():
            if sse.data == "[DONE]":
                break
            _take_chunk(res, json.loads(sse.data))
    res.ended = time.perf_counter()
    return res


def _take_chunk(res: StreamResult, chunk: dict[str, Any]) -> None:
    if any(c.get("delta", {}).get("content") for c in chunk.get("choices") or []):
        now = time.perf_counter()
        if res.ttft is None:
            res.ttft = now - res.started
        res.decode_time = now - res.started - res.ttft
        res.output_tokens += 1  # replaced by usage when the server reports it
    if usage := chunk.get("usage"):
        res.output_tokens = usage.get("completion_tokens", res.output_tokens)
        res.prompt_tokens = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details") or {}
        res.cached_tokens = details.get("cached_tokens")


class Prompts:
    """Chat prompts of exact token counts, as the target's ``/tokenize`` counts them."""

    def __init__(self, client: httpx.AsyncClient, target: Target, seed: int = 7) -> None:
        self.client, self.target, self.rng = client, target, random.Random(seed)

    async def count(self, messages: list[dict[str, str]]) -> int:
        body = {"model": self.target.model, "messages": messages, "add_generation_prompt": True}
        resp = await self.client.post(f"{self.target.base_url}/tokenize", json=body)
        resp.raise_for_status()
        return int(resp.json()["count"])

    def words(self, n: int) -> list[str]:
        return [self.rng.choice(WORDS) for _ in range(n)]

    async def build(
        self, n_tokens: int, base: list[dict[str, str]] | None = None
    ) -> list[dict[str, str]]:
        """A chat of exactly ``n_tokens`` prompt tokens. A fresh one opens with a random session
        number in its system message, so no two prompts share even one small KV block (the
        template's default system prompt would, on engines with 16-token blocks). With
        ``base``, the chat extends ``base``'s messages: the same prefix, a new tail."""
        if base is None:
            system = {"role": "system", "content": f"Session {self.rng.randrange(10**9)}."}
            fixed: list[str] = []
        else:
            system, fixed = base[0], base[1]["content"].split()
        words: list[str] = []
        for _ in range(8):
            messages = [system, {"role": "user", "content": " ".join(fixed + words)}]
            missing = n_tokens - await self.count(messages)
            if missing == 0:
                return messages
            words = words + self.words(missing) if missing > 0 else words[:missing]
        raise RuntimeError(f"could not build a prompt of exactly {n_tokens} tokens")
