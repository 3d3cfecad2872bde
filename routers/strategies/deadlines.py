"""First-token deadlines: how long each planned target may take to start a streamed answer
before the gateway moves on, so that the request's TTFT objective can still be met.

Without them a target that hangs holds a request with a 3 s objective for the whole
first-token timeout (60 s by default, often set to 10 s) before the fallback starts.
With them, each planned target but the last gets a ``Deadline``:

- ``by_s``, counted from the request's start: ``objective - tail(next target) - 50 ms``,
  the latest moment that still leaves the next target its p99 TTFT prediction
  (``predict.ttft_tail_s`` of ``predict.as_rescue``: the longer of its recent and its
  longer-run p99) and the switch to meet the objective. An unmeasured next
  target reserves what the first measured target after it needs (it may not answer
  either: cold, the cheap targets are tried first and the measured one is the rescue);
  with none measured, nothing is reserved. (It reserved nothing before: at start-up an
  unmeasured `budget` before an unmeasured `mid` was then waited on until the objective
  had passed, and those were a third of one run's misses.)
- ``patience_s``, counted from the attempt's own start: the later of the target's p90
  TTFT prediction and 1.5 x its mean one (at least ``MIN_PATIENCE_S``). The attempt is
  never cut before it: a healthy target is rarely given up on (each cut throws away a
  request that was about to start and starts it again from nothing; cutting at the slack
  alone gives up on a 0.45 s target at 0.4 s when the next one needs 0.6 s of a 1 s
  objective), while a hanging one is left once it is clearly late. Not p99: a target with
  a wide spread (p99 past the slack) would then hold every request through a hang
  until the objective is lost, though moving on at the slack still meets it.
  Measured from the attempt, not the request: time the request spent before it (queueing,
  earlier targets) says nothing about this target. An unmeasured target has none.

When the slack is under ``MIN_SHARE`` of the objective the next target cannot surely (at
its p99) save it. If the next target's mean still fits after this one's p99, the target is
given its p99 (``last_chance_s``): past it, its prediction is what is wrong (a queue not
learnt yet) and the next target likely still meets the objective. Otherwise cutting early
would only throw away an answer that was coming: the target then gets its *hang patience*
(the objective, its p99.9, 3 x its mean, whichever is latest), which only catches a target
that hangs. Patience comes from measurements only, never from the cut penalty (a target
cut before must not be waited on longer for it). The last target has no
deadline (its own timeouts apply: an answer late is better than none), nor do requests
without a TTFT objective (patience alone would cut a target whose queue the load curve has
not learnt yet, and so never let it learn). A strategy may set a target's deadline itself
(``Ranked.deadline``: exploration tries a target predicted to be slow, which must be cut
by the slack whatever its patience).

Hedging (``hedged_first``, the ``slo`` strategy's ``hedge_share``): rather than only being
cut, the first target of a request with its own objective may be raced against the second,
started once the first is late (between its p90 and p99, as late as still leaves the second
its p99 TTFT) or at the cut, if sooner: a late answer that was about to come is kept,
and a hanging target is left sooner than its cut (``routers.hedge`` runs the race and caps
its cost).

Pure: ``first_token_deadlines`` and ``hedged_first`` read the request and the health
snapshot only.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from msgspec import Struct

from core.routing import HealthView, RouteRequest, TargetHealth
from routers.strategies.predict import RESERVE_Z, as_rescue, ttft_s, ttft_tail_s
from routers.targets import Target

MIN_SHARE = 0.25  # slack below this share of the objective cannot save it
PATIENCE_Z = 1.2816  # the standard normal's 90th percentile
PATIENCE_MEAN_MULTIPLE = 1.5
SWITCH_S = 0.05  # and the moving on itself (cancel, plan, connect)
HANG_Z = 3.0902  # p99.9
HANG_MEAN_MULTIPLE = 3.0
MIN_PATIENCE_S = 0.25  # below this, the gateway's own scheduling noise decides


class Hedge(Struct, frozen=True):
    """Start the next target alongside this one ``after_s`` after this attempt's start
    (or at its cut, if sooner; None: at its cut), if the alias has spent under
    ``max_share`` of its recent requests on hedges (``routers.hedge``; None: uncapped, a
    race in place of a cut, see ``rescue.raced``)."""

    after_s: float | None
    max_share: float | None


class Deadline(Struct, frozen=True):
    """When an attempt is given up without a first token: at ``by_s`` after the request's
    start, but never before ``patience_s`` after the attempt's start (None: no patience).
    With ``hedge``, the next target is started alongside instead, at the hedge moment (no
    later than the cut would be), and the first to answer serves."""

    by_s: float
    patience_s: float | None = None
    hedge: Hedge | None = None

    def hedge_window_s(self, request_elapsed_s: float) -> float | None:
        """Seconds after an attempt's start (``request_elapsed_s`` into the request) at
        which to hedge it; None without a hedge."""
        if self.hedge is None:
            return None
        window = self.window_s(request_elapsed_s)
        return window if self.hedge.after_s is None else min(window, self.hedge.after_s)

    def window_s(self, request_elapsed_s: float) -> float:
        """Seconds an attempt starting ``request_elapsed_s`` into the request may wait."""
        left = self.by_s - request_elapsed_s
        return left if self.patience_s is None else max(left, self.patience_s)


def _measured(health: TargetHealth) -> TargetHealth:
    """``health`` without its cut penalty and floor: what its samples alone say."""
    return msgspec.structs.replace(health, ttft_penalty=1.0, ttft_floor_s=None)


def patience_s(req: RouteRequest, health: TargetHealth) -> float | None:
    """How long a target is given before it counts as hanging (see the module
    docstring), from its measurements only; None when unmeasured."""
    measured = _measured(health)
    tail, mean = ttft_tail_s(req, measured, PATIENCE_Z), ttft_s(req, measured)
    if tail is None or mean is None:
        return None
    return max(tail, PATIENCE_MEAN_MULTIPLE * mean, MIN_PATIENCE_S)


def hang_patience_s(req: RouteRequest, health: TargetHealth, objective_s: float) -> float:
    """How long a target is given when no later target could still meet the objective:
    the later of the objective itself, its p99.9 prediction and 3 x its mean one. Cutting
    it sooner cannot save the objective, only throw away an answer that was coming; this
    only catches a target that hangs."""
    measured = _measured(health)
    tail, mean = ttft_tail_s(req, measured, HANG_Z), ttft_s(req, measured)
    return max(objective_s, tail or 0.0, HANG_MEAN_MULTIPLE * (mean or 0.0))


def last_chance_s(
    req: RouteRequest, health: TargetHealth, rescue_s: float | None, objective_s: float
) -> float:
    """Patience when no later target can surely (at its p99) meet the objective: the
    target's own p99 when the next one's mean still fits after it (past its p99 the
    target's prediction is what is wrong, a queue it has not learnt, and the rescue
    likely still meets the objective), else its hang patience (``hang_patience_s``).
    Holding a queued local box for the whole objective, as before, was a sure miss:
    end to end, most misses in the first 10 s (the box measured idle, then loaded)."""
    measured = _measured(health)
    own_p99 = ttft_tail_s(req, measured, RESERVE_Z)
    hang = hang_patience_s(req, health, objective_s)
    if own_p99 is None or rescue_s is None or own_p99 + SWITCH_S + rescue_s > objective_s:
        return hang
    return max(own_p99, patience_s(req, health) or 0.0)


def first_token_deadlines(
    req: RouteRequest, ordered: Sequence[Target], health: HealthView, z: float = RESERVE_Z
) -> dict[str, Deadline]:
    """Each planned target's deadline but the last's (see the module docstring); empty
    without a TTFT objective."""
    if req.slo_ttft_ms is None:
        return {}
    objective = req.slo_ttft_ms / 1000.0
    deadlines: dict[str, Deadline] = {}
    for place, current in enumerate(ordered[:-1]):
        now = health.health(current.label)
        reserve = _first_reserve(req, ordered[place + 1 :], health, z)
        slack = objective - (SWITCH_S + reserve if reserve is not None else 0.0)
        if slack < MIN_SHARE * objective:  # the next one cannot surely save it
            rescue = _first_reserve(req, ordered[place + 1 :], health, 0.0)
            deadlines[current.label] = Deadline(0.0, last_chance_s(req, now, rescue, objective))
        else:
            deadlines[current.label] = Deadline(slack, patience_s(req, now))
    return deadlines


def _first_reserve(
    req: RouteRequest, later: Sequence[Target], health: HealthView, z: float
) -> float | None:
    """The ``z`` tail of the first measured target in ``later`` (None: none is)."""
    for target in later:
        reserve = ttft_tail_s(req, as_rescue(req, health.health(target.label)), z)
        if reserve is not None:
            return reserve
    return None


def hedged_first(
    req: RouteRequest, ordered: Sequence[Target], health: HealthView, max_share: float
) -> Deadline | None:
    """The first target's deadline with a hedge, for a request with its own TTFT
    objective (None otherwise, or when the second target's own prediction already misses
    it: hedging could not help). The hedge moment is the latest that leaves the second
    target its p99 TTFT (and the switch) within the objective (when no such moment is
    left, its mean), but no sooner than the first target's patience (its p90: a target
    on time is not doubled) and no later than its p99 (later, it is as good as hanging);
    unmeasured first target: that latest moment. The cut stays as
    ``first_token_deadlines`` sets it (also hang patience: a hedge, unlike a cut, throws
    nothing away).

    Why the second target's p99 and not its mean (the first version): a hedge that left
    it only its mean rescued about half of the late requests; end to end, requests whose
    hedge came too late missed by 0.1-0.3 s (a premium rescue at 2.6 s of a 3 s
    objective)."""
    if max_share <= 0 or len(ordered) < 2 or req.slo_ttft_ms is None:
        return None
    objective = req.slo_ttft_ms / 1000.0
    second = as_rescue(req, health.health(ordered[1].label))
    backup = ttft_s(req, second) or 0.0
    latest = objective - backup - SWITCH_S
    if latest <= 0.0:
        return None
    safe = objective - (ttft_tail_s(req, second, RESERVE_Z) or backup) - SWITCH_S
    deadline = first_token_deadlines(req, ordered[:2], health)[ordered[0].label]
    current = health.health(ordered[0].label)
    late, hanging = patience_s(req, current), ttft_tail_s(req, _measured(current), RESERVE_Z)
    after = safe if safe > 0.0 else latest
    if late is not None and hanging is not None:
        after = min(max(after, late), max(hanging, late))
    return msgspec.structs.replace(deadline, hedge=Hedge(after, max_share))
