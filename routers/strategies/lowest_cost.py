"""Lowest cost: cheapest first by price x estimated tokens; unpriced targets last."""

from __future__ import annotations

import random
from collections.abc import Sequence

from core.config_routing import LowestCostStrategy
from core.routing import HealthView, RouteRequest
from routers.strategies.base import Ranked
from routers.strategies.predict import cost_usd, fmt_usd
from routers.targets import Target


def by_cost(req: RouteRequest, targets: Sequence[Target]) -> list[tuple[Target, float | None]]:
    """``targets`` cheapest first with their estimated cost; unpriced ones (None) last, and
    equal costs in config order (the sort is stable)."""
    costed = [(t, cost_usd(req, t)) for t in targets]
    return sorted(costed, key=lambda pair: (pair[1] is None, pair[1] or 0.0))


def cost_reason(place: int, cost: float | None) -> str:
    """``cheapest ($0.0002 est.)`` for the first place, ``$0.001 est.`` after it."""
    if cost is None:
        return "unpriced"
    return f"cheapest ({fmt_usd(cost)} est.)" if place == 0 else f"{fmt_usd(cost)} est."


class LowestCost:
    """Orders by ``Target.price`` applied to the request's prompt and expected output
    tokens (``Price.per_token``); local targets priced by the hour compete on the same
    per-token terms."""

    name = "lowest_cost"

    def __init__(self, config: LowestCostStrategy | None = None) -> None:
        self.config = config or LowestCostStrategy()

    def plan(
        self,
        req: RouteRequest,
        candidates: Sequence[Target],
        health: HealthView,
        rng: random.Random,
    ) -> list[Ranked]:
        return [
            Ranked(t, f"lowest_cost: {cost_reason(i, cost)}")
            for i, (t, cost) in enumerate(by_cost(req, candidates))
        ]
