"""Exploration for the ``slo`` strategy: which cheaper target a request with slack
tries first, and how long that try may take. Pure: it reads the request, the health
snapshot and the strategy's config.

An estimate is only corrected by new samples, and a target predicted to miss gets none.
So a request with slack (its own objective, at least twice the cheapest feasible
target's tail) tries first the cheapest idle unmeasured target; else a target penalised
for cuts and holding nothing, once its last cut is ``recover_after_s`` old (a target
back from a hang is found again within seconds); else, with probability
``explore_share``, the stalest cheaper target predicted to miss whose evidence is
``explore_after_s`` old. The try is cut in time for the fallback's p99 (``window_s``).
"""

from __future__ import annotations

import math
import random

from core.config_routing import SloStrategy
from core.routing import RouteRequest, TargetHealth
from routers.strategies.deadlines import MIN_SHARE, SWITCH_S
from routers.strategies.predict import RESERVE_Z, as_rescue, cost_usd, ttft_tail_s
from routers.targets import Target


def probe(
    config: SloStrategy,
    z: float,
    req: RouteRequest,
    feasible: list[tuple[Target, float | None]],
    missing: list[Target],
    healths: dict[str, TargetHealth],
    rng: random.Random,
    unknown: Target | None,
) -> Target | None:
    """The target to explore for ``req`` (see the module docstring), or None:
    ``unknown`` (the cheapest idle unmeasured target) whenever the slack over the
    cheapest ``feasible`` target (at its tail at ``z``) is half the objective, else a
    cheaper ``missing`` one (``_stale_probe``)."""
    if not feasible or req.slo_ttft_ms is None:
        return None
    best, best_cost = feasible[0]
    slack = slack_s(req, healths[best.label], z)
    if best_cost is None or slack is None or slack < req.slo_ttft_ms / 2000.0:
        return None  # unpriced, unmeasured, or too little slack to spare
    if unknown is not None and cost_or_inf(req, unknown) < best_cost:
        return unknown
    if config.explore_share <= 0:
        return None
    return _stale_probe(config, req, best_cost, missing, healths, rng)


def _stale_probe(
    config: SloStrategy,
    req: RouteRequest,
    best_cost: float,
    missing: list[Target],
    healths: dict[str, TargetHealth],
    rng: random.Random,
) -> Target | None:
    """The cheaper missing target to probe: a recovering one (``_recovering``) whose
    last cut is ``recover_after_s`` old, else, with probability ``explore_share``,
    the stalest whose evidence is ``explore_after_s`` old."""
    cheaper = [t for t in missing if (cost := cost_usd(req, t)) is not None and cost < best_cost]

    def age(t: Target) -> float:
        return evidence_age_s(req, healths[t.label])

    recovering = [
        t
        for t in cheaper
        if _recovering(req, healths[t.label]) and age(t) >= config.recover_after_s
    ]
    if recovering:
        return max(recovering, key=age)
    stale = [t for t in cheaper if age(t) >= config.explore_after_s]
    if not stale or rng.random() >= config.explore_share:
        return None
    return max(stale, key=age)


def evidence_age_s(req: RouteRequest, health: TargetHealth) -> float:
    """How old what rules ``health``'s prediction for ``req`` is: the cut penalty's age
    when the penalty covers ``req``'s prompt, else the last sample's in the band of
    ``req``'s prompt length (``TargetHealth.age_for``). Short prompts that a target keeps
    serving refresh its samples, but say nothing about the long prompts it was cut on,
    or was once slow on: without the penalty's age, a target that hung on long prompts
    was never re-tried with one until its penalty had decayed (a minute and more);
    without the band's, `mid`, fitted at 0.4 ms per prompt token from its first few
    samples (the menu's 0.05), was predicted at 2.6 s for 4,000-token RAG while chat kept
    its estimate fresh, and 140 of 165 RAG requests went to premium (end to end, seed 6,
    session 20)."""
    if _penalized(req, health) and health.ttft_penalty_age_s is not None:
        return health.ttft_penalty_age_s
    return health.age_for(req.prompt_tokens) or 0.0


def _penalized(req: RouteRequest, health: TargetHealth) -> bool:
    """Whether ``health``'s cut penalty covers ``req``'s prompt at the load now."""
    return health.ttft_penalty > 1.0 and health.penalty_covers(req.prompt_tokens)


def _recovering(req: RouteRequest, health: TargetHealth) -> bool:
    """A target whose cut penalty covers ``req`` and that holds no request: once its
    last cut is ``recover_after_s`` old, the next request with slack probes it without
    the ``explore_share`` draw, one probe at a time (a cut renews the penalty's age): one
    probe per ``recover_after_s`` and a probe's cut while it hangs, found again within
    about that once it is back. The draw alone left ``mid`` unprobed 27-40 s after its
    hang end to end (decision 0010, session 16); a probe only every ``explore_after_s``
    (10 s) left it 8 s, a dozen RAG requests at premium's price (session 18). The probe
    is cut in time for its fallback's p99, so a probe costs the request a delay, not its
    objective."""
    return _penalized(req, health) and health.in_flight == 0


def window_s(req: RouteRequest, fallback: TargetHealth) -> float | None:
    """How long a probe may take before it is cut in time for ``fallback``'s p99 TTFT
    and the switch, however slow the probed target is predicted to be (see deadlines);
    None when that leaves the probe under ``MIN_SHARE`` of the objective. At the
    fallback's p90 (until session 18) one cut probe in ten left it too little time: end
    to end, a probe of `mid` right after its hang missed."""
    slack = slack_s(req, as_rescue(req, fallback), RESERVE_Z)
    if req.slo_ttft_ms is None or slack is None:
        return None
    window = slack - SWITCH_S
    return window if window >= MIN_SHARE * req.slo_ttft_ms / 1000.0 else None


def slack_s(req: RouteRequest, fallback: TargetHealth, z: float) -> float | None:
    """Seconds of the TTFT objective left once ``fallback``'s tail TTFT is set aside (None:
    no objective, or the fallback is unmeasured)."""
    tail = ttft_tail_s(req, fallback, z)
    if req.slo_ttft_ms is None or tail is None:
        return None
    return req.slo_ttft_ms / 1000.0 - tail


def cost_or_inf(req: RouteRequest, target: Target) -> float:
    """``target``'s estimated cost for ``req``; unpriced: infinite (last)."""
    cost = cost_usd(req, target)
    return math.inf if cost is None else cost
