"""The seeded mixed workload: Poisson arrivals, 70% chat / 30% RAG, TTFT objectives.

Contract: ``make_trace(seed, n, rate)`` is a pure function of its arguments. Each request's
prompt is text whose gateway estimate (characters / 4 + 4 per message) equals
``prompt_tokens`` exactly; ``key`` (sent as the OpenAI ``user`` field) names the request to
the fake upstreams, which draw its latencies and answer length from it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.routing_e2e.wire import CHARS_PER_TOKEN, TOKENS_PER_MESSAGE

CLASSES = ("chat-800ms", "chat-3s", "rag-3s", "none")
OBJECTIVE_MS = {"chat-800ms": 800.0, "chat-3s": 3000.0, "rag-3s": 3000.0, "none": None}
NOMINAL_NONE_MS = 5000.0  # shown separately for requests without an objective
_FILLER = "the quick brown fox jumps over the lazy dog while bench tokens pass by. "


@dataclass(frozen=True, slots=True)
class TraceRequest:
    index: int
    key: str
    at_s: float  # arrival, seconds after the trace start
    kind: str  # chat or rag
    slo_class: str  # one of CLASSES
    prompt_tokens: int
    max_tokens: int

    @property
    def slo_ttft_ms(self) -> float | None:
        return OBJECTIVE_MS[self.slo_class]

    def body(self, model: str) -> dict[str, object]:
        """The streamed chat request, with usage asked for."""
        return {
            "model": model,
            "messages": [{"role": "user", "content": prompt_text(self.key, self.prompt_tokens)}],
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": self.key,
        }


def prompt_text(key: str, tokens: int) -> str:
    """Text of exactly ``(tokens - 4) * 4`` characters, starting with the request key."""
    chars = max(0, tokens - TOKENS_PER_MESSAGE) * CHARS_PER_TOKEN
    head = f"[{key}] "
    body = head + _FILLER * (chars // len(_FILLER) + 1)
    return body[:chars]


def _draw(rng: random.Random, index: int, at_s: float, seed: int) -> TraceRequest:
    key = f"s{seed}-r{index}"
    if rng.random() < 0.7:
        u = rng.random()
        slo_class = "chat-800ms" if u < 0.45 else "chat-3s" if u < 0.75 else "none"
        return TraceRequest(
            index, key, at_s, "chat", slo_class, rng.randint(50, 400), rng.randint(100, 300)
        )
    return TraceRequest(
        index, key, at_s, "rag", "rag-3s", rng.randint(2000, 6000), rng.randint(200, 400)
    )


def make_trace(seed: int, n: int, rate: float) -> list[TraceRequest]:
    """``n`` requests with exponential gaps of mean ``1 / rate`` s; the first at 0."""
    rng = random.Random(seed)
    at, out = 0.0, []
    for index in range(n):
        out.append(_draw(rng, index, at, seed))
        at += rng.expovariate(rate)
    return out


def span_s(trace: list[TraceRequest]) -> float:
    """Seconds from the first to the last arrival (at least one gap's worth)."""
    return max(trace[-1].at_s if trace else 0.0, 1e-9)
