"""Least latency: power of two choices on predicted latency for the first place."""

from __future__ import annotations

import random
from collections.abc import Sequence

from core.config_routing import LeastLatencyStrategy
from core.routing import HealthView, RouteRequest
from routers.strategies.base import Ranked
from routers.strategies.predict import fmt_s, total_s
from routers.targets import Target


class LeastLatency:
    """Predicted latency = TTFT + time per token x expected output tokens (``predict``).

    First place: sample two candidates at random and take the one predicted faster (power
    of two choices: near-best choices without every gateway replica herding onto the one
    target that looked fastest a moment ago). The rest follow by prediction, then config
    order.

    Unmeasured targets are explored: an unknown prediction counts as equal to the best
    known one (0 when nothing is known), so an unmeasured target wins a sampled pair
    against any slower known target and ties with the fastest (ties broken by the draw).
    """

    name = "least_latency"

    def __init__(self, config: LeastLatencyStrategy | None = None) -> None:
        self.config = config or LeastLatencyStrategy()

    def plan(
        self,
        req: RouteRequest,
        candidates: Sequence[Target],
        health: HealthView,
        rng: random.Random,
    ) -> list[Ranked]:
        if not candidates:
            return []
        predicted = [total_s(req, health.health(t.label)) for t in candidates]
        known = [p for p in predicted if p is not None]
        fill = min(known) if known else 0.0
        effective = [fill if p is None else p for p in predicted]
        first, pair_reason = _two_choices(effective, predicted, rng)
        rest = sorted((i for i in range(len(candidates)) if i != first), key=effective.__getitem__)
        ranked = [Ranked(candidates[first], f"least_latency: {pair_reason}")]
        ranked += [Ranked(candidates[i], f"least_latency: {_shown(predicted[i])}") for i in rest]
        return ranked


def _two_choices(
    effective: list[float], predicted: list[float | None], rng: random.Random
) -> tuple[int, str]:
    """Index of the better of two sampled candidates, and the reason."""
    if len(effective) == 1:
        return 0, f"only candidate ({_shown(predicted[0])})"
    a, b = rng.sample(range(len(effective)), 2)
    win, lose = (a, b) if effective[a] <= effective[b] else (b, a)
    if predicted[win] is None:
        return win, "unmeasured, explored first"
    loser = predicted[lose]
    shown_loser = "unmeasured" if loser is None else fmt_s(loser)
    return win, f"better of two sampled ({_shown(predicted[win])} vs {shown_loser})"


def _shown(seconds: float | None) -> str:
    return "unmeasured" if seconds is None else f"predicted {fmt_s(seconds)}"
