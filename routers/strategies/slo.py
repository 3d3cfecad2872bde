"""SLO: the cheapest target predicted to meet the request's latency objective."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from core.config_routing import SloStrategy
from core.routing import HealthView, RouteRequest, TargetHealth
from routers.strategies.base import Ranked
from routers.strategies.lowest_cost import by_cost, cost_reason
from routers.strategies.predict import fmt_s, total_s, ttft_s
from routers.targets import Target


class Slo:
    """The objective is ``req.slo_ttft_ms`` and/or ``req.slo_total_ms`` (already resolved
    by the gateway from the request header, the tenant or the alias).

    Feasible = predicted TTFT and predicted total within the objective. Order: feasible
    targets cheapest first (unpriced last), then the infeasible ones fastest first by
    predicted total. Unmeasured targets count as feasible, so they get measured (one
    possibly slow answer, after which their estimate decides). With no objective at all,
    plain lowest cost.
    """

    name = "slo"

    def __init__(self, config: SloStrategy | None = None) -> None:
        self.config = config or SloStrategy()

    def plan(
        self,
        req: RouteRequest,
        candidates: Sequence[Target],
        health: HealthView,
        rng: random.Random,
    ) -> list[Ranked]:
        objective = _objective(req)
        if objective is None:
            return [
                Ranked(t, f"slo: no objective; {cost_reason(i, cost)}")
                for i, (t, cost) in enumerate(by_cost(req, candidates))
            ]
        healths = {t.label: health.health(t.label) for t in candidates}
        feasible = [t for t in candidates if _meets(req, healths[t.label])]
        missing = [t for t in candidates if not _meets(req, healths[t.label])]
        ranked = [
            Ranked(t, _feasible_reason(i, cost, objective, req, healths[t.label]))
            for i, (t, cost) in enumerate(by_cost(req, feasible))
        ]

        def fastest(t: Target) -> float:
            predicted = total_s(req, healths[t.label])
            return math.inf if predicted is None else predicted

        for t in sorted(missing, key=fastest):
            shown = _predicted(req, healths[t.label])
            ranked.append(Ranked(t, f"slo: misses {objective}; fastest left ({shown})"))
        return ranked


def _objective(req: RouteRequest) -> str | None:
    """``ttft<=800ms, total<=5000ms`` or None when the request has no objective."""
    parts = []
    if req.slo_ttft_ms is not None:
        parts.append(f"ttft<={req.slo_ttft_ms:g}ms")
    if req.slo_total_ms is not None:
        parts.append(f"total<={req.slo_total_ms:g}ms")
    return ", ".join(parts) or None


def _meets(req: RouteRequest, health: TargetHealth) -> bool:
    first, whole = ttft_s(health), total_s(req, health)
    if first is not None and req.slo_ttft_ms is not None and first * 1000 > req.slo_ttft_ms:
        return False
    return not (
        whole is not None and req.slo_total_ms is not None and whole * 1000 > req.slo_total_ms
    )


def _predicted(req: RouteRequest, health: TargetHealth) -> str:
    first = ttft_s(health)
    if first is None:
        return "unmeasured"
    if req.slo_total_ms is None:
        return f"predicted {fmt_s(first)}"
    whole = total_s(req, health) or first
    return f"predicted ttft {fmt_s(first)}, total {fmt_s(whole)}"


def _feasible_reason(
    place: int, cost: float | None, objective: str, req: RouteRequest, health: TargetHealth
) -> str:
    shown = _predicted(req, health)
    if shown == "unmeasured":
        shown = "unmeasured, explored"
    if place == 0:
        price = "" if cost is None else f", {cost_reason(1, cost)}"
        return f"slo: cheapest meeting {objective} ({shown}{price})"
    return f"slo: meets {objective}, {cost_reason(1, cost)} ({shown})"
