"""SLO: the cheapest target predicted to meet the request's latency objective."""

from __future__ import annotations

import random
from collections.abc import Sequence

from core.config_routing import SloStrategy
from core.routing import HealthView, RouteRequest, TargetHealth
from routers.strategies.base import Ranked
from routers.strategies.lowest_cost import by_cost, cost_reason
from routers.strategies.predict import fmt_s, total_s, ttft_s, ttft_tail_s
from routers.targets import Target


class Slo:
    """The objective is ``req.slo_ttft_ms`` and/or ``req.slo_total_ms`` (already resolved
    by the gateway from the request header, the tenant or the alias).

    Feasible = the *tail* of the predicted TTFT, and the total built on it, within the
    objective: ``predict.ttft_tail_s`` at ``z`` (default 1.28, the 90th percentile), which
    grows with the request's prompt and with how far off the target's predictions have
    been. A target whose mean just meets a 4 s objective misses it about half the time;
    one whose 90th percentile meets it, about one time in ten at worst, and only for the
    requests nearest the limit.

    Order: feasible targets cheapest first (unpriced last), then the infeasible ones
    closest to the objective first (smallest ratio of tail prediction to objective: with
    only a TTFT objective, the quickest to start however slowly it then generates).
    Unmeasured targets count as feasible, so they get measured (one possibly slow answer,
    after which their estimate decides). With no objective at all, plain lowest cost.
    """

    name = "slo"

    def __init__(self, config: SloStrategy | None = None, *, z: float | None = None) -> None:
        self.config = config or SloStrategy()
        self.z = self.config.tail_z if z is None else z

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
        z = self.z
        healths = {t.label: health.health(t.label) for t in candidates}
        over = {t.label: _overshoot(req, healths[t.label], z) for t in candidates}
        feasible = [t for t in candidates if over[t.label] <= 1.0]
        missing = [t for t in candidates if over[t.label] > 1.0]
        ranked = [
            Ranked(t, _feasible_reason(i, cost, objective, req, healths[t.label], z))
            for i, (t, cost) in enumerate(by_cost(req, feasible))
        ]
        for t in sorted(missing, key=lambda t: over[t.label]):
            shown = _predicted(req, healths[t.label], z)
            ranked.append(Ranked(t, f"slo: misses {objective}; closest left ({shown})"))
        return ranked


def _objective(req: RouteRequest) -> str | None:
    """``ttft<=800ms, total<=5000ms`` or None when the request has no objective."""
    parts = []
    if req.slo_ttft_ms is not None:
        parts.append(f"ttft<={req.slo_ttft_ms:g}ms")
    if req.slo_total_ms is not None:
        parts.append(f"total<={req.slo_total_ms:g}ms")
    return ", ".join(parts) or None


def _overshoot(req: RouteRequest, health: TargetHealth, z: float) -> float:
    """The worst ratio of tail prediction to objective over the objectives the request
    sets (1.5: 50% over; <= 1: feasible). Only those objectives count: a TTFT objective
    says nothing about generation speed. Unmeasured counts as 0 (feasible, explored)."""
    ratios = [0.0]
    first, whole = ttft_tail_s(req, health, z), total_s(req, health, z)
    if first is not None and req.slo_ttft_ms is not None:
        ratios.append(first * 1000 / max(req.slo_ttft_ms, 1e-9))
    if whole is not None and req.slo_total_ms is not None:
        ratios.append(whole * 1000 / max(req.slo_total_ms, 1e-9))
    return max(ratios)


def _predicted(req: RouteRequest, health: TargetHealth, z: float) -> str:
    """``predicted 420ms``; with a measured spread ``predicted 420ms (tail 610ms)``."""
    first, tail = ttft_s(req, health), ttft_tail_s(req, health, z)
    if first is None or tail is None:
        return "unmeasured"
    shown = fmt_s(first) if health.ttft_spread is None else f"{fmt_s(first)} (tail {fmt_s(tail)})"
    if req.slo_total_ms is None:
        return f"predicted {shown}"
    whole = total_s(req, health, z) or tail
    return f"predicted ttft {shown}, total {fmt_s(whole)}"


def _feasible_reason(
    place: int,
    cost: float | None,
    objective: str,
    req: RouteRequest,
    health: TargetHealth,
    z: float,
) -> str:
    shown = _predicted(req, health, z)
    if shown == "unmeasured":
        shown = "unmeasured, explored"
    if place == 0:
        price = "" if cost is None else f", {cost_reason(1, cost)}"
        return f"slo: cheapest meeting {objective} ({shown}{price})"
    return f"slo: meets {objective}, {cost_reason(1, cost)} ({shown})"
