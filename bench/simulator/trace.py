"""The request trace: Poisson arrivals and a mixed workload.

Three request classes, each with its own time-to-first-token objective (the SLO the
gateway resolves per request):

- ``chat``: many short turns (prompt ~350 tokens, answer ~120), TTFT objective 1 s;
- ``summarise``: some long-context summaries (prompt ~12k tokens, answer ~300), 4 s;
- ``generate``: a few long generations (prompt ~600, answer ~1,500), 1.5 s.

Lengths are log-normal around the medians (clamped), arrivals exponential at ``rate_per_s``.
Everything comes from one seeded ``random.Random``: the same seed gives the same trace.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestClass:
    """One kind of request: its share of the trace, length distributions (log-normal
    median and sigma, clamped to ``[lo, hi]``), the client's ``max_tokens`` and the TTFT
    objective in milliseconds."""

    name: str
    share: float
    prompt_median: float
    prompt_sigma: float
    output_median: float
    output_sigma: float
    max_tokens: int
    slo_ttft_ms: float
    prompt_lo: int = 16
    prompt_hi: int = 100_000


@dataclass(frozen=True)
class SimRequest:
    index: int
    arrival_s: float
    klass: str
    prompt_tokens: int
    output_tokens: int
    max_tokens: int
    slo_ttft_ms: float


MIXED = (
    RequestClass("chat", 0.75, 350, 0.6, 120, 0.6, 512, 1000.0, prompt_hi=4000),
    RequestClass("summarise", 0.15, 12_000, 0.5, 300, 0.4, 1024, 4000.0, prompt_lo=3000),
    RequestClass("generate", 0.10, 600, 0.5, 1500, 0.4, 4096, 1500.0, prompt_hi=4000),
)


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(rng.lognormvariate(math.log(median), sigma))))


def _pick(rng: random.Random, mix: tuple[RequestClass, ...]) -> RequestClass:
    total = sum(c.share for c in mix)
    draw = rng.random() * total
    for klass in mix:
        draw -= klass.share
        if draw < 0:
            return klass
    return mix[-1]


def make_trace(
    n: int, rate_per_s: float, seed: int, mix: tuple[RequestClass, ...] = MIXED
) -> list[SimRequest]:
    """``n`` requests with Poisson arrivals at ``rate_per_s``, classes drawn by share."""
    rng = random.Random(seed)
    now = 0.0
    trace = []
    for index in range(n):
        now += rng.expovariate(rate_per_s)
        klass = _pick(rng, mix)
        prompt = _lognormal(
            rng, klass.prompt_median, klass.prompt_sigma, klass.prompt_lo, klass.prompt_hi
        )
        output = _lognormal(rng, klass.output_median, klass.output_sigma, 1, klass.max_tokens)
        trace.append(
            SimRequest(index, now, klass.name, prompt, output, klass.max_tokens, klass.slo_ttft_ms)
        )
    return trace
