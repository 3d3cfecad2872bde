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

        score = w_prefix * prefix_blocks / len(req.prefix_hashes)
              + w_queue  * (1 - load / (max load among local candidates + 1))
              + w_kv     * (1 - kv_usage)

    ``load`` is the replica's running + waiting requests (or the gateway's own in-flight
    count when that is higher: it is fresher than the last metrics poll). llm-d scores the
    waiting queue alone, which suits GPU replicas whose batches absorb more requests at
    little cost; a CPU replica slows down with every running sequence, so running counts.

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
        mean_in_flight = sum(h.in_flight for h in healths) / len(healths) if healths else 0.0
        hot_limit = self.config.hot_spot_factor * mean_in_flight + 1
        scored = []
        for target, h in zip(local, healths, strict=True):
            score, reason = self._score(req, h, max_load, h.in_flight > hot_limit)
            scored.append((score, rng.random(), target, reason))
        scored.sort(key=lambda item: (-item[0], item[1]))
        ranked = [Ranked(t, reason) for _, _, t, reason in scored]
        ranked += [
            Ranked(t, "prefix_aware: not local, config order") for t in candidates if not t.local
        ]
        return ranked

    def _score(
        self, req: RouteRequest, h: TargetHealth, max_load: int, hot: bool
    ) -> tuple[float, str]:
        c = self.config
        blocks = len(req.prefix_hashes)
        matched = min(h.prefix_blocks, blocks)
        share = matched / blocks if blocks else 0.0
        prefix = 0.0 if hot else c.w_prefix * share
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
