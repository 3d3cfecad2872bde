"""Whether a request routed by ``slo`` can be saved after its first target is cut: the
rules that decide when a target must meet the TTFT objective alone, at ``alone_z``
(the p99), rather than at its ordinary tail. Pure: they read the request and the health
snapshot only."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from msgspec import Struct

from core.routing import HealthView, RouteRequest, TargetHealth, ttft_exceeds_p
from routers.strategies.base import Ranked
from routers.strategies.deadlines import (
    MIN_SHARE,
    SWITCH_S,
    Deadline,
    Hedge,
    first_token_deadlines,
    hang_patience_s,
    patience_s,
)
from routers.strategies.predict import RESERVE_Z, as_rescue, cost_usd, ttft_s, ttft_tail_s
from routers.targets import Target


class Rescue(Struct, frozen=True):
    """A target judged with a rescue: the rescue's label (the plan puts it right after
    the target), the chance ``cut_p`` that the target is cut and the rescue paid for too,
    and the early cut (seconds after the request's start) when there is one."""

    by: str
    cut_p: float
    early_cut_s: float | None = None


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
        tail = ttft_tail_s(req, as_rescue(req, health), RESERVE_Z)
        if tail is None or (tail <= room and not cut_only(health)):
            return True
    return False


def rescued_in_time(
    req: RouteRequest,
    target: Target,
    candidates: Sequence[Target],
    healths: dict[str, TargetHealth],
    miss_p: float,
) -> tuple[bool, Rescue | None]:
    """Whether ``target``, feasible at its tail, with the best other measured target as
    its rescue, misses the TTFT objective at most ``miss_p`` of the time, and that rescue
    with the chance that ``target`` is cut (None when none was judged: never cut); the
    plan must put the rescue right after ``target``, since the cut is timed for it.
    ``target`` is cut at its patience (``deadlines.patience_s``) or later, when the
    rescue's p99 leaves it more, and then the rescue must answer in what is left. A miss
    needs both to be late, so the chance is the product (their latencies are independent
    draws). True when there is nothing to judge (no objective, ``target`` unmeasured).

    A target never measured is no rescue here while a measured one can be judged
    (``rescuable`` still counts it: it may be the fast one); with no other measured
    target at all, an unmeasured one is still the hope it was (without it, a cheap
    target feasible at its p90 but not its p99 for 1 s was dropped for an unmeasured
    dear one: the spill-over integration test, session 18). Counting it as one whenever
    some target was unmeasured (until session 17) meant at start-up that no rescue was
    named while one was unmeasured: the box went first, premium after it kept its
    own patience, was cut on a long prompt its fit had not seen yet, and the request
    ended on ``budget`` past 5 s (3-4 of a cell's 6-9 misses were such start-up chains;
    decision 0010, session 17).

    Why: at the p90 alone a target was feasible however little its patience left a
    rescue; end to end, ``budget`` feasible for 3 s (tail 2.9 s) was held to its p90
    and then nothing could still answer in time. Requiring the rescue's p99 to fit after
    the patience (session 13) judged on an edge: ``mid`` for 3 s RAG (p90 2.0 s,
    premium's p99 0.93 s) missed it by 20 ms, though both being late is a 0.1 x 2%
    chance (decision 0010, session 14)."""
    health = healths[target.label]
    first, late = ttft_s(req, health), patience_s(req, health)
    if req.slo_ttft_ms is None or first is None or late is None:
        return True, None
    objective = req.slo_ttft_ms / 1000.0
    spread = health.spread_for(req.prompt_tokens) or 0.0
    # the chance that no rescue answers in time, the rescue's own chance, the rescue,
    # the chance that target is cut
    best: tuple[float, float, str, float] = (1.0, 1.0, "", 0.0)
    measured, unmeasured = 0, 0  # other targets judged as rescues; others never measured
    for other in candidates:
        rescue = as_rescue(req, healths[other.label])
        mean = ttft_s(req, rescue)
        if other.label == target.label:
            continue
        if cut_only(rescue) or mean is None:
            unmeasured += mean is None
            continue
        measured += 1
        cut = max(late, objective - (ttft_tail_s(req, rescue, RESERVE_Z) or 0.0) - SWITCH_S)
        if cut >= objective:
            late_p = 1.0  # cut only once the objective has passed: no rescue in time
        else:
            left = objective - cut - SWITCH_S
            late_p = ttft_exceeds_p(mean, rescue.spread_for(req.prompt_tokens) or 0.0, left)
        cut_p = ttft_exceeds_p(first, spread, min(cut, objective))
        # never cut: no rescue to place ("")
        best = min(best, (cut_p * late_p, late_p, other.label if cut_p > 0.0 else "", cut_p))
    if not measured and unmeasured:
        return True, None  # no measured rescue at all: an unmeasured one may be the fast one
    return best[0] <= miss_p, Rescue(best[2], best[3]) if best[2] else None


EARLY_CUT_MAX_P = 0.5  # an early cut never comes before the target's median


def early_cut_s(
    req: RouteRequest,
    target: Target,
    candidates: Sequence[Target],
    healths: dict[str, TargetHealth],
    miss_p: float,
) -> Rescue | None:
    """When ``target`` (feasible at its tail) fails ``rescued_in_time`` because its
    patience comes too late for a rescue: the moment (seconds after the request's start)
    to cut it *before* its patience, in time for the quickest other measured target's
    p99, with that target (the plan puts it right after ``target``) and the chance of the
    cut, if that plan is worth it; None otherwise.

    Worth it: (1) a miss needs both late, at most ``miss_p``; (2) the expected cost, the
    target's own plus the rescue's each time it is cut, stays under the rescue's alone;
    (3) the target is cut at most ``EARLY_CUT_MAX_P`` of the time (past that it is a
    detour more often than the server); (4) the cut leaves the target at least
    ``deadlines.MIN_SHARE`` of the objective. The planner then cuts at that moment with
    no patience (``deadlines.Deadline(cut, None)``).

    Why: patience (the p90) protects a healthy target from cuts that throw away an answer
    about to come, but it made the rescue check all-or-nothing. End to end, ``mid`` for
    3 s RAG (mean ~1.4 s, spread ~0.45 as measured) had its patience at ~2.25 s, which
    left premium 0.7 s (late about a quarter of the time): judged at its p99 (3.6 s) it
    went infeasible and RAG went to premium at 5x the price. Cut at 1.9 s instead (in
    time for premium's p99), it is cut ~20% of the time and a miss needs premium past its
    p99 too (under 0.2%); the expected cost is ~40% of premium's (decision 0010, session
    16)."""
    health = healths[target.label]
    first, own_cost = ttft_s(req, health), cost_usd(req, target)
    if req.slo_ttft_ms is None or first is None or own_cost is None:
        return None
    objective = req.slo_ttft_ms / 1000.0
    best: tuple[float, Target] | None = None  # (the rescue's p99, the rescue)
    for other in candidates:
        rescue = as_rescue(req, healths[other.label])
        tail = ttft_tail_s(req, rescue, RESERVE_Z)
        if other.label == target.label or cut_only(rescue) or tail is None:
            continue
        if best is None or tail < best[0]:
            best = (tail, other)
    if best is None:
        return None
    cut = objective - best[0] - SWITCH_S
    rescue_cost = cost_usd(req, best[1])
    if cut < MIN_SHARE * objective or rescue_cost is None:
        return None
    cut_p = ttft_exceeds_p(first, health.spread_for(req.prompt_tokens) or 0.0, cut)
    rescue = as_rescue(req, healths[best[1].label])
    late_p = ttft_exceeds_p(
        ttft_s(req, rescue) or 0.0, rescue.spread_for(req.prompt_tokens) or 0.0, best[0]
    )
    worth = own_cost + cut_p * rescue_cost < rescue_cost
    if cut_p > EARLY_CUT_MAX_P or cut_p * late_p > miss_p or not worth:
        return None
    return Rescue(best[1].label, cut_p, cut)


def rescues_next(
    req: RouteRequest,
    ranked: list[Ranked],
    rescue_of: dict[str, str],
    healths: dict[str, TargetHealth],
) -> list[Ranked]:
    """``ranked`` with the rescue each target was judged with (``rescue_of``, by label)
    moved right after the first such target, with only a hang's patience
    (``deadlines.hang_patience_s``): the cut is timed for that rescue, and the rescue is
    the request's last chance. Before, the next target was the next cheapest feasible one
    (end to end a cheap target cut in time for premium was followed by ``mid``, which
    could not answer in what was left: a third of one run's misses), and a rescue that
    started late was still cut at its own p90 for the target after it (in the simulator,
    most of the misses early cuts added)."""
    if req.slo_ttft_ms is None:
        return ranked
    objective = req.slo_ttft_ms / 1000.0
    for place, item in enumerate(ranked[:-1]):
        by = rescue_of.get(item.target.label)
        if by is None:
            continue
        rest = ranked[place + 1 :]
        moved = [
            msgspec.structs.replace(
                r, deadline=Deadline(0.0, hang_patience_s(req, healths[by], objective))
            )
            for r in rest
            if r.target.label == by
        ]
        return ranked[: place + 1] + moved + [r for r in rest if r.target.label != by]
    return ranked


def raced(
    req: RouteRequest, ranked: list[Ranked], rescue_of: dict[str, str], health: HealthView
) -> list[Ranked]:
    """``ranked`` with its first target, when it was judged with the rescue right after
    it (``rescues_next``), raced against that rescue at its cut instead of cut there: an
    uncapped hedge at the cut moment (its ``Ranked.deadline``, else the one the planner
    would give it: ``deadlines.first_token_deadlines``, which for the first target reads
    only the first measured target after it, the rescue). Unchanged otherwise.

    Why: a cut throws away an answer that may be about to come, so a miss needed the
    target late past its *cut* and the rescue late; raced, it needs the target late past
    the *objective*. End to end, misses after a cut were 1.4% of the ~750 rescues of
    twelve runs, all of them requests priority met; raced, 4-7 per twelve runs, within
    the runs' noise (decision 0010, session 23). It costs no more than the cut it
    replaces: a managed API bills a cut attempt's prompt anyway, so when the rescue wins
    the bill is the cut's, and when the target wins, the rescue's prompt replaces its
    whole answer at a dearer price. It holds the target's slot until the race ends.

    The race starts at the deadline's ``by_s`` (the rescue's latest start that leaves it
    its p99), even where the target's patience runs longer: patience keeps a cut from
    throwing away an answer about to come, and a race throws none away. Started at the
    patience, as a cut is, the rescue had less than its p99 left: end to end, all five
    misses after a cut in one no-feed run (seeds 1-6) were rescues started 0.1-0.7 s past
    ``by_s``, 3.02-3.09 s in (decision 0010, session 27). A last-chance deadline (``by_s``
    0: no rescue can surely save it) races at its patience."""
    if len(ranked) < 2 or rescue_of.get(ranked[0].target.label) != ranked[1].target.label:
        return ranked
    first, label = ranked[0], ranked[0].target.label
    if first.deadline is None:
        pair = [first.target, ranked[1].target]
        deadline = first_token_deadlines(req, pair, health).get(label)
    else:
        deadline = first.deadline
    if deadline is None:
        return ranked
    start = deadline.by_s if deadline.by_s > 0 else None
    race = msgspec.structs.replace(deadline, hedge=Hedge(start, None))
    return [msgspec.structs.replace(first, deadline=race), *ranked[1:]]


def load_unproven(health: TargetHealth) -> bool:
    """Whether ``health``'s target holds more requests now than any recent TTFT sample
    was dispatched with: its load factor there is an extrapolation. For a request no
    target could rescue, ``slo`` then ranks it as unmeasured (behind a pricier target
    whose median meets the objective). End to end, 1.2 s into a run, three 800 ms
    requests went to the 4-slot box measured once, idle, while it held 4 long answers;
    they queued and missed (the run's only misses premium would not have had)."""
    seen = health.ttft_load_seen
    return seen is not None and health.in_flight > seen


def cut_only(health: TargetHealth) -> bool:
    """Known only from cut attempts (``predict.ttft_s`` falls back to the floor)."""
    return health.ttft_s is None and health.ttft_base_s is None and health.ttft_floor_s is not None
