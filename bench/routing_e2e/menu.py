"""The menu of fake upstreams: latency model, prices and limits (pure data + draws).

Contract: every latency draw is a pure function of ``(seed, upstream name, request key,
attempt)`` so a seed replays the same latencies for the same requests whatever the policy
or arrival interleaving; the caller passes ``scale`` to compress all times (tests).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

MANAGED_PREFILL_S_PER_TOKEN = 0.05e-3  # managed APIs: + prompt_tokens x 0.05 ms
LOCAL_PREFILL_S_PER_TOKEN = 0.1e-3  # the local box: + prompt_tokens x 0.1 ms
LOCAL_KV_TOKENS = 65_536  # the local box's KV pool, for vllm:kv_cache_usage_perc
LOCAL_BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class UpstreamSpec:
    """One upstream on the menu. ``limit`` is a hard concurrency limit (429 above it) for a
    managed API, or the number of slots (FIFO queue above it) when ``slots`` is True."""

    name: str
    ttft_median_s: float
    ttft_sigma: float
    decode_s_per_token: float
    input_per_mtok: float
    output_per_mtok: float
    limit: int
    slots: bool = False  # True: the local box (queue for a slot instead of a 429)

    @property
    def prefill_s_per_token(self) -> float:
        return LOCAL_PREFILL_S_PER_TOKEN if self.slots else MANAGED_PREFILL_S_PER_TOKEN

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        """USD for tokens served here, at this upstream's own prices."""
        return (
            prompt_tokens * self.input_per_mtok + completion_tokens * self.output_per_mtok
        ) / 1e6


MENU: dict[str, UpstreamSpec] = {
    "premium": UpstreamSpec("premium", 0.35, 0.35, 0.015, 5.0, 15.0, 64),
    "mid": UpstreamSpec("mid", 1.1, 0.4, 0.020, 1.0, 3.0, 32),
    "budget": UpstreamSpec("budget", 1.8, 0.5, 0.030, 0.3, 0.9, 32),
    "local": UpstreamSpec("local", 0.25, 0.3, 0.025, 0.05, 0.1, 4, slots=True),
}
ORDER = ("premium", "mid", "budget", "local")  # the priority order of the targets


def _rng(seed: int, name: str, key: str, attempt: int) -> random.Random:
    return random.Random(f"{seed}:{name}:{key}:{attempt}")


def draw_ttft_s(spec: UpstreamSpec, seed: int, key: str, attempt: int, prompt_tokens: int) -> float:
    """Service TTFT (excluding any queueing for a local slot): log-normal around the
    median, plus prefill proportional to the prompt. Unscaled seconds."""
    z = _rng(seed, spec.name, key, attempt).gauss(0.0, 1.0)
    return spec.ttft_median_s * math.exp(spec.ttft_sigma * z) + (
        prompt_tokens * spec.prefill_s_per_token
    )


def completion_tokens(seed: int, key: str, max_tokens: int) -> int:
    """How many tokens the answer has: 60-100% of ``max_tokens``, the same on every
    upstream for one request (so cost differences come from prices, not lengths)."""
    share = random.Random(f"{seed}:len:{key}").uniform(0.6, 1.0)
    return max(1, round(max_tokens * share))
