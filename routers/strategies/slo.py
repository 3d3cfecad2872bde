"""SLO: the cheapest target predicted to meet the request's latency objective."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import msgspec

from core.config_routing import SloStrategy
from core.routing import HealthView, RouteRequest, TargetHealth, ttft_exceeds_p
from routers.strategies import explore, rescue
from routers.strategies.base import Ranked
from routers.strategies.deadlines import Deadline, first_token_deadlines, hedged_first
from routers.strategies.lowest_cost import by_cost, cost_reason
from routers.strategies.predict import cost_usd, total_s, ttft_s, ttft_tail_s
from routers.strategies.slo_reasons import feasible_reason, objective_text, predicted_text
from routers.targets import Target

_BUSY_UNMEASURED = 1.0 + 1e-9  # see _overshoot
_CUT_ONLY = 1.0 + 2e-9  # never measured, only cut: just after the busy unmeasured ones
_RESERVED = 1.0 + 3e-9  # feasible, but its last free slots are kept (see _leave_room)


class Slo:
    """The objective is ``req.slo_ttft_ms`` and/or ``req.slo_total_ms`` (already resolved
    by the gateway from the request header, the tenant or the alias); a request with
    neither is routed as if it asked for ``default_ttft_ms`` (when set), and leaves
    ``default_reserve`` free slots below a target's queue (``_leave_room``).

    Feasible = the *tail* of the predicted TTFT, and the total built on it, within the
    objective: ``predict.ttft_tail_s`` at ``z`` (default 1.28, the 90th percentile), which
    grows with the request's prompt, with how far off the target's predictions have been
    and with the requests the target holds now (its load factor). A target whose mean
    just meets a 4 s objective misses it about half the time; one whose 90th percentile
    meets it, about one time in ten at worst, and only for the requests nearest the limit.
    When no target could still meet the objective after the first was cut
    (``rescue.rescuable``), the tail is at ``alone_z`` (the p99) instead: a miss is final
    (a target holding more requests than its samples saw as unmeasured: ``load_unproven``).
    A target whose cut at its patience leaves no rescue in time more than ``1 -
    Phi(alone_z)`` of the time (``rescue.rescued_in_time``) is cut early for its rescue
    when that is worth it (``rescue.early_cut_s``), else judged at ``alone_z``; the rescue
    a target was judged with comes right after it in the plan (``rescue.rescues_next``)
    and, for the first target, races it from its cut instead (``rescue.raced``).

    Order: feasible targets cheapest first (unpriced last), then the infeasible ones
    least likely to be late first (``_by_late_chance``; with an objective on the whole
    answer too, the smallest ratio of tail prediction to objective).
    Unmeasured targets get measured (one possibly slow answer, after which their estimate
    decides): for a request without an objective of its own (the default one), the
    cheapest idle unmeasured target counts as feasible; a request with its own objective
    tries it first only while a measured target can still meet the objective behind it
    (the exploration rule below, without the draw), and otherwise ranks unmeasured
    targets just after the feasible ones, in the configured order. At start-up, with
    nothing measured, such requests follow the operator's order (as ``priority``), not a
    chain of unknown targets that each take the whole objective before being cut. With
    nothing feasible, an unmeasured (or only ever cut) target ranks after any pricier
    measured one whose median meets the objective (``_unknowns_behind_close``). A target
    only ever cut is never feasible: its floor is a bound, not a prediction.

    Feasible targets are ordered by expected cost: a target judged with a rescue
    (``rescue.Rescue``) costs its price plus the rescue's times the chance it is cut.

    Exploration (``explore``): an estimate is only corrected by new samples, and a target
    predicted to miss gets none. So a request with slack (its own objective, at least
    twice the cheapest feasible target's tail) tries first a cheaper target: an idle
    unmeasured one, one penalised for cuts and holding nothing once its last cut is
    ``recover_after_s`` old, or, with probability ``explore_share``, the stalest one
    predicted to miss; the try is cut in time for the fallback's p99.
    """

    name = "slo"

    def __init__(self, config: SloStrategy | None = None, *, z: float | None = None) -> None:
        self.config = config or SloStrategy()
        self.z = self.config.tail_z if z is None else z
        self.alone_z = max(self.z, self.config.alone_z) if z is None else z
        self.miss_p = 0.5 * math.erfc(self.alone_z / math.sqrt(2.0))  # 1 - Phi(alone_z): 1%

    def plan(
        self,
        req: RouteRequest,
        candidates: Sequence[Target],
        health: HealthView,
        rng: random.Random,
    ) -> list[Ranked]:
        goal = self._goal(req)
        objective = objective_text(goal, defaulted=goal is not req)
        if objective is None:
            return [
                Ranked(t, f"slo: no objective; {cost_reason(i, cost)}")
                for i, (t, cost) in enumerate(by_cost(req, candidates))
            ]
        healths = {t.label: health.health(t.label) for t in candidates}
        alone = not rescue.rescuable(goal, candidates, healths)
        z = self.alone_z if alone else self.z
        over = {t.label: _overshoot(goal, healths[t.label], z) for t in candidates}
        for t in candidates if alone else ():  # a miss is final: no bet on extrapolations
            if 0.0 < over[t.label] <= 1.0 and rescue.load_unproven(healths[t.label]):
                over[t.label] = _BUSY_UNMEASURED
        own = goal is req
        reserve = self.config.default_reserve
        kept = set() if own or reserve is None else _leave_room(candidates, healths, over, reserve)
        judged = self._judge_rescues(goal, candidates, healths, over)
        early = {label: r.early_cut_s for label, r in judged.items() if r.early_cut_s is not None}
        unknown = _explore_one_unknown(goal, candidates, healths, over, keep=not own)
        feasible = _by_expected_cost(
            goal, [t for t in candidates if over[t.label] <= 1.0], judged, candidates
        )
        missing = [t for t in candidates if over[t.label] > 1.0]
        position = {t.label: i for i, t in enumerate(candidates)}

        def closest(t: Target) -> tuple[float, float]:
            # Ties: the cheapest; unmeasured targets for a request's own objective in the
            # configured order (nothing known: the operator's order, as priority's).
            if own and over[t.label] == _BUSY_UNMEASURED:
                return over[t.label], position[t.label]
            return over[t.label], explore.cost_or_inf(goal, t)

        _by_late_chance(goal, missing, healths, over)
        if own:
            _unknowns_behind_close(goal, missing, healths, over)
        missing.sort(key=closest)
        ranked = [
            Ranked(
                t,
                feasible_reason(
                    i, (cost, expected), objective, goal, healths[t.label], z, early.get(t.label)
                ),
                deadline=None if t.label not in early else Deadline(early[t.label]),
            )
            for i, (t, cost, expected) in enumerate(feasible)
        ]
        for t in missing:
            shown = predicted_text(goal, healths[t.label], z)
            if t.label in kept:
                knee = healths[t.label].ttft_load_knee
                why = f"keeps {reserve} free below its queue at {knee} in flight ({shown})"
            else:
                why = f"misses {objective}; closest left ({shown})"
            ranked.append(Ranked(t, f"slo: {why}"))
        rescue_of = {label: r.by for label, r in judged.items()}
        ranked = rescue.rescues_next(goal, ranked, rescue_of, healths)
        if goal is not req:
            return rescue.raced(goal, _with_deadlines(goal, ranked, health, z), rescue_of, health)
        probe = explore.probe(
            self.config,
            self.z,
            req,
            [(t, c) for t, c, _ in feasible],
            missing,
            healths,
            rng,
            unknown,
        )
        rest = [r for r in ranked if probe is not None and r.target.label != probe.label]
        window = None if not rest else explore.window_s(req, healths[rest[0].target.label])
        if probe is None or window is None:
            return self._with_hedge(req, rescue.raced(req, ranked, rescue_of, health), health)
        age = explore.evidence_age_s(req, healths[probe.label])
        known = "unmeasured" if probe is unknown else f"estimate {age:.0f}s old: "
        if probe is not unknown:
            known += predicted_text(req, healths[probe.label], z)
        reason = f"slo: exploring ({known}), cut in time for {rest[0].target.label}"
        return [Ranked(probe, reason, deadline=Deadline(window)), *rest]

    def _judge_rescues(
        self,
        goal: RouteRequest,
        candidates: Sequence[Target],
        healths: dict[str, TargetHealth],
        over: dict[str, float],
    ) -> dict[str, rescue.Rescue]:
        """Hold each target feasible at its tail to the rescue rules, in ``over``: one
        whose cut at its patience leaves no rescue in time (``rescue.rescued_in_time``)
        is feasible if its p99 meets the objective alone (not at a load never measured:
        ``rescue.load_unproven``) or it is worth cutting early (``rescue.early_cut_s``).
        Returns, by label, each target judged with a rescue."""
        judged: dict[str, rescue.Rescue] = {}
        for t in candidates:
            if not 0.0 < over[t.label] <= 1.0:
                continue
            rescued, by = rescue.rescued_in_time(goal, t, candidates, healths, self.miss_p)
            if rescued:
                if by is not None:
                    judged[t.label] = by
                continue
            alone = _overshoot(goal, healths[t.label], self.alone_z)
            if alone > 1.0:
                early = rescue.early_cut_s(goal, t, candidates, healths, self.miss_p)
                if early is not None:
                    judged[t.label] = early
                    continue
            elif rescue.load_unproven(healths[t.label]):
                alone = _BUSY_UNMEASURED  # its p99 alone, at a load never seen
            over[t.label] = alone
        return judged

    def _with_hedge(
        self, req: RouteRequest, ranked: list[Ranked], health: HealthView
    ) -> list[Ranked]:
        """``ranked`` with the first target's deadline hedged when ``hedge_share`` allows
        (``deadlines.hedged_first``); an early cut keeps its moment, the hedge starting
        there at the latest. A first target raced against its rescue (``rescue.raced``)
        keeps that race."""
        share = self.config.hedge_share
        if ranked and ranked[0].deadline is not None and ranked[0].deadline.hedge is not None:
            return ranked
        deadline = hedged_first(req, [r.target for r in ranked], health, share)
        if deadline is None:
            return ranked
        if ranked[0].deadline is not None:
            deadline = msgspec.structs.replace(ranked[0].deadline, hedge=deadline.hedge)
        return [msgspec.structs.replace(ranked[0], deadline=deadline), *ranked[1:]]

    def _goal(self, req: RouteRequest) -> RouteRequest:
        """``req`` itself, or with the default TTFT objective when it sets none."""
        default = self.config.default_ttft_ms
        if req.slo_ttft_ms is not None or req.slo_total_ms is not None or default is None:
            return req
        return msgspec.structs.replace(req, slo_ttft_ms=default)


def _by_expected_cost(
    req: RouteRequest,
    feasible: Sequence[Target],
    judged: dict[str, rescue.Rescue],
    candidates: Sequence[Target],
) -> list[tuple[Target, float | None, float | None]]:
    """``feasible`` with their list and expected costs (``_expected_cost``), cheapest
    first by expected cost (unpriced targets last, ties in config order). By list price
    alone, ``budget`` cut early for premium about half the time (3 s RAG, its median
    2.0 s, cut at 1.9 s) went before ``mid`` (five times its price, cut a sixth of the
    time), and cost more in the end: 0.0012 + 0.48 x 0.027 USD against 0.005 + 0.16 x
    0.027 (decision 0010, session 18)."""
    by_label = {t.label: t for t in candidates}
    costed = [
        (t, cost, _expected_cost(req, cost, judged.get(t.label), by_label))
        for t, cost in by_cost(req, feasible)
    ]
    return sorted(costed, key=lambda item: (item[2] is None, item[2] or 0.0))


def _expected_cost(
    req: RouteRequest,
    cost: float | None,
    judged_with: rescue.Rescue | None,
    by_label: dict[str, Target],
) -> float | None:
    """A target's expected cost for ``req``: its own ``cost`` plus, when judged with a
    rescue, the rescue's (an unpriced one: 0) times the chance it is cut. None: unpriced."""
    if cost is None or judged_with is None:
        return cost
    return cost + judged_with.cut_p * (cost_usd(req, by_label[judged_with.by]) or 0.0)


def _leave_room(
    candidates: Sequence[Target],
    healths: dict[str, TargetHealth],
    over: dict[str, float],
    reserve: int,
) -> set[str]:
    """Trunk reservation, for a request on the default objective: each target feasible in
    ``over`` where it and ``reserve`` more would reach the queue its load curve shows
    (``ttft_load_knee``) becomes just infeasible (tried first when nothing else is
    feasible). Returns their labels. The free slots are for requests with objectives of
    their own, whom a cheap box saves far more (``SloStrategy.default_reserve``)."""
    kept = set()
    for t in candidates:
        health = healths[t.label]
        knee = health.ttft_load_knee
        if knee is not None and over[t.label] <= 1.0 and health.in_flight + 1 + reserve > knee:
            over[t.label] = _RESERVED
            kept.add(t.label)
    return kept


def _explore_one_unknown(
    req: RouteRequest,
    candidates: Sequence[Target],
    healths: dict[str, TargetHealth],
    over: dict[str, float],
    *,
    keep: bool,
) -> Target | None:
    """Leave only the cheapest idle unmeasured target feasible (``over`` 0), or none when
    not ``keep``; the others rank just after the feasible ones. Returns that target (None
    when there is none). A plan through several unknown targets, each given the whole
    objective, is a chain of cuts that misses it (the cold start)."""
    unknown = [
        t for t in candidates if over[t.label] == 0.0 and ttft_s(req, healths[t.label]) is None
    ]
    ordered = [target for target, _ in by_cost(req, unknown)]
    for target in ordered[0 if not keep else 1 :]:
        over[target.label] = _BUSY_UNMEASURED
    return ordered[0] if ordered else None


def _unknowns_behind_close(
    req: RouteRequest,
    missing: Sequence[Target],
    healths: dict[str, TargetHealth],
    over: dict[str, float],
) -> None:
    """Rank each unmeasured (or only ever cut) target just after the closest measured
    target that is pricier and whose *median* prediction meets the objective (in
    ``over``). Nothing feasible means the objective is tight; a cheap unknown is more
    likely a slow target than a fast one, and the measured target usually meets it (at
    start-up, premium: median 540 ms, tail 890 ms against 800 ms, was ranked after three
    unknown cheaper targets that were each cut in turn). An unknown target pricier than
    every such one keeps its place before them: it may be the fast target a loaded cheap
    one should spill over to."""
    if req.slo_ttft_ms is None:
        return
    close = [
        t
        for t in missing
        if over[t.label] not in (_BUSY_UNMEASURED, _CUT_ONLY)
        and (first := ttft_s(req, healths[t.label])) is not None
        and first * 1000.0 <= req.slo_ttft_ms
    ]
    for target in missing:
        if over[target.label] not in (_BUSY_UNMEASURED, _CUT_ONLY):
            continue
        cost = explore.cost_or_inf(req, target)
        pricier = [over[t.label] for t in close if explore.cost_or_inf(req, t) > cost]
        if pricier:
            over[target.label] = math.nextafter(min(pricier), math.inf)


def _by_late_chance(
    req: RouteRequest,
    missing: Sequence[Target],
    healths: dict[str, TargetHealth],
    over: dict[str, float],
) -> None:
    """Re-score each measured target that misses ``req``'s TTFT objective by the chance
    that it is late (``1 + 1e-8 + chance`` in ``over``: after the just-infeasible ones,
    ordered by that chance, then by the overshoot). Its tail's overshoot ranked a narrow
    target whose mean misses the objective before a wide one whose mean meets it: end to
    end, at start-up, an 800 ms request went to the local box (mean 820 ms, tail 1.5 s:
    late ~42% of the time) over premium (mean 540 ms, tail 1.6 s: ~19%) and missed.
    Requests with an objective on the whole answer keep the ratio (its spread is not
    modelled)."""
    if req.slo_ttft_ms is None or req.slo_total_ms is not None:
        return
    for t in missing:
        health = healths[t.label]
        mean = ttft_s(req, health)
        if over[t.label] <= _RESERVED or mean is None:
            continue
        late = ttft_exceeds_p(
            mean, health.spread_for(req.prompt_tokens) or 0.0, req.slo_ttft_ms / 1000.0
        )
        # ties (no spread measured: late or not for sure) by the old ratio, at most 1e-6
        over[t.label] = 1.0 + 1e-8 + late + 1e-9 * min(over[t.label], 1e3)


def _with_deadlines(
    goal: RouteRequest, ranked: list[Ranked], health: HealthView, z: float
) -> list[Ranked]:
    """``ranked`` with the first-token deadlines of the default objective ``goal``: a
    request routed as if it asked for 5 s leaves a hanging target as one that asked would
    (the planner gives requests without an objective none); early cuts stay."""
    deadlines = first_token_deadlines(goal, [r.target for r in ranked], health, z)
    return [
        msgspec.structs.replace(r, deadline=r.deadline or deadlines.get(r.target.label))
        for r in ranked
    ]


def _overshoot(req: RouteRequest, health: TargetHealth, z: float) -> float:
    """The worst ratio of tail prediction to objective over the objectives the request
    sets (1.5: 50% over; <= 1: feasible). Only those objectives count: a TTFT objective
    says nothing about generation speed. Unmeasured counts as 0 (feasible, explored) when
    idle, and as just infeasible (after the feasible targets, before those known to miss)
    while a request is already measuring it: one request explores a new target, not the
    whole burst that came with it."""
    first, whole = ttft_tail_s(req, health, z), total_s(req, health, z)
    if first is None and health.in_flight > 0:
        return _BUSY_UNMEASURED
    if first is not None and rescue.cut_only(health):
        # Never measured, only cut: its floor x penalty says "slower than the wait", a
        # bound, not a prediction. As one it made a target cut once at 0.6 s look like
        # 1.2 s, feasible for 3 s, and the rescue of every cut of the local box at
        # start-up (its real median: 1.8 s).
        return _CUT_ONLY
    ratios = [0.0]
    if first is not None and req.slo_ttft_ms is not None:
        ratios.append(first * 1000 / max(req.slo_ttft_ms, 1e-9))
    if whole is not None and req.slo_total_ms is not None:
        ratios.append(whole * 1000 / max(req.slo_total_ms, 1e-9))
    return max(ratios)
