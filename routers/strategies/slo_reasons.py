"""The reasons ``routers.strategies.slo`` gives for its ranks: the objective, the
prediction and the costs, as operators read them in route traces and dry runs."""

from __future__ import annotations

from core.routing import RouteRequest, TargetHealth
from routers.strategies.lowest_cost import cost_reason
from routers.strategies.predict import fmt_s, fmt_usd, total_s, ttft_s, ttft_tail_s


def objective_text(req: RouteRequest, *, defaulted: bool = False) -> str | None:
    """``ttft<=800ms, total<=5000ms`` (``default ttft<=5000ms`` when ``defaulted``) or None
    when the request has no objective."""
    parts = []
    if req.slo_ttft_ms is not None:
        parts.append(f"ttft<={req.slo_ttft_ms:g}ms")
    if req.slo_total_ms is not None:
        parts.append(f"total<={req.slo_total_ms:g}ms")
    text = ", ".join(parts)
    return (f"default {text}" if defaulted else text) or None


def predicted_text(req: RouteRequest, health: TargetHealth, z: float) -> str:
    """``predicted 420ms``; with a measured spread ``predicted 420ms (tail 610ms)``; on a
    target holding requests, what they add: ``predicted 1.2s x1.80 at 5 in flight``. A
    route reason is how an operator (and the routing benchmark) sees the load a decision
    was made on: a health sample a second later may be another load altogether."""
    first, tail = ttft_s(req, health), ttft_tail_s(req, health, z)
    if first is None or tail is None:
        return "unmeasured" + _load_text(health)
    shown = fmt_s(first) if health.ttft_spread is None else f"{fmt_s(first)} (tail {fmt_s(tail)})"
    if req.slo_total_ms is None:
        return f"predicted {shown}{_load_text(health)}"
    whole = total_s(req, health, z) or tail
    return f"predicted ttft {shown}, total {fmt_s(whole)}{_load_text(health)}"


def _load_text(health: TargetHealth) -> str:
    """`` x1.80 at 5 in flight`` (the load factor only when it is not 1), with ``, 2.5s
    queue`` where a slot wait is predicted, or nothing when the target holds no
    request."""
    if health.in_flight <= 0:
        return ""
    factor = health.ttft_load_factor
    scaled = "" if factor == 1.0 else f" x{factor:.2f}"
    queue = "" if health.ttft_queue_s <= 0 else f", {fmt_s(health.ttft_queue_s)} queue"
    return f"{scaled} at {health.in_flight} in flight{queue}"


def feasible_reason(
    place: int,
    costs: tuple[float | None, float | None],
    objective: str,
    req: RouteRequest,
    health: TargetHealth,
    z: float,
    early_cut_s: float | None = None,
) -> str:
    """The reason of a feasible target; ``costs``: (list, expected) (``_expected_cost``),
    the expected one shown when a rescue adds to it."""
    shown = predicted_text(req, health, z)
    if ttft_tail_s(req, health, z) is None:
        shown = "unmeasured, explored" + _load_text(health)
    if early_cut_s is not None:
        shown += f", cut at {fmt_s(early_cut_s)} for a rescue"
    cost, expected = costs
    price = cost_reason(1, cost)
    if cost is not None and expected is not None and expected > cost:
        price += f", {fmt_usd(expected)} with its rescue"
    if place == 0:
        return f"slo: cheapest meeting {objective} ({shown}, {price})"
    return f"slo: meets {objective}, {price} ({shown})"
