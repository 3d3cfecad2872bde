"""Priority: the targets in the order the policy file lists them."""

from __future__ import annotations

import random
from collections.abc import Sequence

from core.config_routing import PriorityStrategy
from core.routing import HealthView, RouteRequest
from routers.strategies.base import Ranked, ordinal
from routers.targets import Target


class Priority:
    """Config order; the first available target serves, the rest are fallbacks."""

    name = "priority"

    def __init__(self, config: PriorityStrategy | None = None) -> None:
        self.config = config or PriorityStrategy()

    def plan(
        self,
        req: RouteRequest,
        candidates: Sequence[Target],
        health: HealthView,
        rng: random.Random,
    ) -> list[Ranked]:
        return [
            Ranked(t, "priority: first available target" if i == 0 else f"priority: {ordinal(i)}")
            for i, t in enumerate(candidates)
        ]
