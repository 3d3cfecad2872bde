"""Round robin: rotate the first place through the candidates (the baseline that
prefix-aware routing is measured against)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from core.config_routing import RoundRobinStrategy
from core.routing import HealthView, RouteRequest
from routers.strategies.base import Ranked
from routers.targets import Target


class RoundRobin:
    """Each call starts one place further along the candidate list; the others follow in
    list order (wrapping). The turn counter is the strategy's only state: one instance per
    alias, rebuilt on config reload."""

    name = "round_robin"

    def __init__(self, config: RoundRobinStrategy | None = None) -> None:
        self.config = config or RoundRobinStrategy()
        self._turn = 0

    def plan(
        self,
        req: RouteRequest,
        candidates: Sequence[Target],
        health: HealthView,
        rng: random.Random,
    ) -> list[Ranked]:
        if not candidates:
            return []
        turn, self._turn = self._turn, self._turn + 1
        start = turn % len(candidates)
        rotated = [*candidates[start:], *candidates[:start]]
        first = Ranked(rotated[0], f"round_robin: turn {turn + 1}")
        return [first, *(Ranked(t, "round_robin: next in rotation") for t in rotated[1:])]
