"""Weighted: an order drawn without replacement, each draw proportional to ``weight``."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from core.config_routing import WeightedStrategy
from core.routing import HealthView, RouteRequest
from routers.strategies.base import Ranked, ordinal
from routers.targets import Target


class Weighted:
    """Target i comes first with probability w_i / sum(w); each later place is drawn the same
    way from the targets left. Weight-0 targets come last, in config order: they serve only
    when every weighted one is gone (a standby).

    Drawn with Efraimidis-Spirakis keys (log(u) / w, largest first), which has exactly the
    distribution of sequential draws without replacement in one pass and one sort.
    """

    name = "weighted"

    def __init__(self, config: WeightedStrategy | None = None) -> None:
        self.config = config or WeightedStrategy()

    def plan(
        self,
        req: RouteRequest,
        candidates: Sequence[Target],
        health: HealthView,
        rng: random.Random,
    ) -> list[Ranked]:
        weighted = [t for t in candidates if t.weight > 0]
        standby = [t for t in candidates if t.weight <= 0]
        # 1 - random() lies in (0, 1], so log() is defined.
        keys = {id(t): math.log(1.0 - rng.random()) / t.weight for t in weighted}
        drawn = sorted(weighted, key=lambda t: keys[id(t)], reverse=True)
        total = sum(t.weight for t in weighted)
        ranked = [
            Ranked(t, f"weighted: drawn {ordinal(i)} (weight {t.weight:g} of {total:g})")
            for i, t in enumerate(drawn)
        ]
        ranked += [Ranked(t, "weighted: weight 0, standby") for t in standby]
        return ranked
