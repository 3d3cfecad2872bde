"""Prefix-aware: send a request to the local replica most likely to hold its prompt's KV
blocks, weighed against queue depth and KV use, without piling onto one hot replica."""

from __future__ import annotations

import random
from collections.abc import Sequence

from core.config_routing import PrefixAwareStrategy
from core.routing import HealthView, RouteRequest, TargetHealth
from routers.strategies.base import Ranked
from routers.targets import Target


class PrefixAware:
    """For local targets::

        score = w_prefix * saved
              + w_queue  * (1 - load / (max load among local candidates + 1))
              + w_kv     * (1 - kv_usage)

    ``saved`` is the share of the avoidable prefill this replica saves: (its matched
    blocks - the fewest any replica matched) / (the prompt's blocks - that fewest), with
    the denominator at least half the prompt so a difference of a block or two is not worth
    a full bonus. Scoring the matched share of the whole prompt instead (llm-d's form)
    hardly separates replicas when all of them hold a long shared system prompt, although
    the one that also holds the conversation saves most of the remaining prefill.

    Anti-hot-spot: a replica whose ``in_flight`` exceeds ``hot_spot_factor`` x the mean
    in-flight of the local candidates + 1 loses its prefix term, so a popular prefix spreads
    to a second replica (which then caches it too) instead of queueing on one.

    Highest score first; equal scores in random order (from ``rng``), so a cold start spreads
    load instead of sending everything to the first replica. Non-local targets follow the
    local ones in config order (the managed fallbacks).
    """

    name = "prefix_aware"

    def __init__(self, config: PrefixAwareStrategy | None = None) -> None:
        self.config = config or PrefixAwareStrategy()

    def plan(
        self,
        req: RouteRequest,
        candidates: Sequence[Target],
        health: HealthView,
        rng: random.Random,
    ) -> list[Ranked]:
        local = [t for t in candidates if t.local]
        healths = [health.health(t.label) for t in local]
        max_load = max((_load(h) for h in healths), default=0)
        blocks = len(req.prefix_hashes)
        fewest = min((min(h.prefix_blocks, blocks) for h in healths), default=0)
        mean_in_flight = sum(h.in_flight for h in healths) / len(healths) if healths else 0.0
        hot_limit = self.config.hot_spot_factor * mean_in_flight + 1
        scored = []
        for target, h in zip(local, healths, strict=True):
            score, reason = self._score(req, h, (max_load, fewest), h.in_flight > hot_limit)
            scored.append((score, rng.random(), target, reason))
        scored.sort(key=lambda item: (-item[0], item[1]))
        ranked = [Ranked(t, reason) for _, _, t, reason in scored]
        ranked += [
            Ranked(t, "prefix_aware: not local, config order") for t in candidates if not t.local
        ]
        return ranked

    def _score(
        self, req: RouteRequest, h: TargetHealth, worst: tuple[int, int], hot: bool
    ) -> tuple[float, str]:
        """``worst``: the highest load and the fewest matched blocks among the replicas."""
        c = self.config
        max_load, fewest = worst
        blocks = len(req.prefix_hashes)
        matched = min(h.prefix_blocks, blocks)
        avoidable = max(blocks - fewest, blocks / 2)
        saved = (matched - fewest) / avoidable if avoidable else 0.0
        prefix = 0.0 if hot else c.w_prefix * saved
        load = _load(h)
        queue = c.w_queue * (1.0 - load / (max_load + 1))
        kv = c.w_kv * (1.0 - h.kv_usage)
        score = prefix + queue + kv
        detail = f"prefix {matched}/{blocks} blocks, load {load}, kv {h.kv_usage:.0%}"
        if hot:
            detail += f", hot spot ({h.in_flight} in flight): prefix bonus dropped"
        return score, f"prefix_aware: score {score:.2f} ({detail})"


def _load(h: TargetHealth) -> int:
    return max(h.running + h.waiting, h.in_flight)
