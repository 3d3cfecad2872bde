"""Whether a request routed by ``slo`` can be saved after its first target is cut: the
rules that decide when a target must meet the TTFT objective alone, at ``alone_z``
(the p99), rather than at its ordinary tail. Pure: they read the request and the health
snapshot only."""

from __future__ import annotations

from collections.abc import Sequence

from core.routing import RouteRequest, TargetHealth, ttft_exceeds_p
from routers.strategies.deadlines import MIN_SHARE, RESERVE_Z, SWITCH_S, patience_s
from routers.strategies.predict import ttft_s, ttft_tail_s
from routers.targets import Target


def rescuable(
    req: RouteRequest, candidates: Sequence[Target], healths: dict[str, TargetHealth]
) -> bool:
    """Whether some target could still meet the TTFT objective at its p99 after the
    first was cut at the latest useful moment (``deadlines.MIN_SHARE``), or may (one
    never measured: it may be the fast one). If none could, the first target must meet
    the objective alone, so feasible means its ``alone_z`` tail meets it: end to end,
    800 ms requests sent to a local box feasible at its p90 and queued there missed,
    premium (p99 ~800 ms) too slow to rescue them."""
    if req.slo_ttft_ms is None:
        return True
    room = (1.0 - MIN_SHARE) * req.slo_ttft_ms / 1000.0 - SWITCH_S
    for target in candidates:
        health = healths[target.label]
        tail = ttft_tail_s(req, health, RESERVE_Z)
        if tail is None or (tail <= room and not cut_only(health)):
            return True
    return False


def rescued_in_time(
    req: RouteRequest,
    target: Target,
    candidates: Sequence[Target],
    healths: dict[str, TargetHealth],
    miss_p: float,
) -> bool:
    """Whether ``target``, feasible at its tail, with the best other measured target as
    its rescue, misses the TTFT objective at most ``miss_p`` of the time: it is cut at
    its patience (``deadlines.patience_s``) or later, when the rescue's p99 leaves it
    more, and then the rescue must answer in what is left. A miss needs both to be
    late, so the chance is the product (their latencies are independent draws). True
    when there is nothing to judge (no objective, ``target`` unmeasured) or another
    target was never measured: it may be the fast one, as ``rescuable`` counts it.

    Why: at the p90 alone a target was feasible however little its patience left a
    rescue; end to end, ``budget`` feasible for 3 s (tail 2.9 s) was held to its p90
    and then nothing could still answer in time. Requiring the rescue's p99 to fit after
    the patience (session 13) judged on an edge: ``mid`` for 3 s RAG (p90 2.0 s,
    premium's p99 0.93 s) missed it by 20 ms, though both being late is a 0.1 x 2%
    chance (decision 0010, session 14)."""
    health = healths[target.label]
    first, late = ttft_s(req, health), patience_s(req, health)
    if req.slo_ttft_ms is None or first is None or late is None:
        return True
    objective = req.slo_ttft_ms / 1000.0
    spread = health.spread_for(req.prompt_tokens) or 0.0
    best = 1.0  # the chance that no rescue answers in time
    for other in candidates:
        rescue = healths[other.label]
        mean = ttft_s(req, rescue)
        if other.label == target.label or cut_only(rescue):
            continue
        if mean is None:
            return True
        cut = max(late, objective - (ttft_tail_s(req, rescue, RESERVE_Z) or 0.0) - SWITCH_S)
        if cut >= objective:
            late_p = 1.0  # cut only once the objective has passed: no rescue in time
        else:
            left = objective - cut - SWITCH_S
            late_p = ttft_exceeds_p(mean, rescue.spread_for(req.prompt_tokens) or 0.0, left)
        best = min(best, ttft_exceeds_p(first, spread, min(cut, objective)) * late_p)
    return best <= miss_p


def cut_only(health: TargetHealth) -> bool:
    """Known only from cut attempts (``predict.ttft_s`` falls back to the floor)."""
    return health.ttft_s is None and health.ttft_base_s is None and health.ttft_floor_s is not None
