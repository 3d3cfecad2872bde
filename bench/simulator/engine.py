"""One policy over one trace: the real planner and strategy decide, the models answer.

Per request, in arrival order: drain the observations made so far into the health board,
build the ``RouteRequest`` the gateway would (prompt tokens, ``max_tokens``, the class's TTFT
objective), plan with ``routers.planner.plan_route`` (filters + the real strategy), then walk
the plan like the executor: a target in an outage fails after ``fail_after_s`` and the next
one is tried, and so is one whose first token would come after its first-token deadline
(``Plan.deadlines``: it is cut there, raising its cut penalty; with a hedge, the first
target is raced against the second from the hedge moment instead); the first that
answers serves. The request's TTFT counts from its arrival, so
time lost on failed attempts counts against the objective. When every candidate is a
saturated local replica, the request queues there (the gateway's admission queue); when
none is left at all, it fails.

Randomness: the strategy gets ``random.Random(seed)``; a request's latency noise comes
from ``random.Random(seed, request index)`` so every policy sees the same luck per request
(common random numbers make the comparison between policies sharper).
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.simulator.health import HealthBoard, Sent
from bench.simulator.targets import LocalTier, Outage, Service, SimTarget
from bench.simulator.trace import SimRequest
from core.errors import InvalidRequestError
from core.protocols import Capabilities, Timeouts
from core.routing import RouteRequest
from routers.executor import MIN_ATTEMPT_WINDOW_S
from routers.planner import plan_route
from routers.strategies.base import Strategy
from routers.strategies.deadlines import Deadline
from routers.targets import Target

ALIAS = "chat"


@dataclass(frozen=True)
class Outcome:
    """What happened to one request. ``ttft_s`` counts from arrival (None: failed)."""

    request: SimRequest
    served_by: str | None
    ttft_s: float | None
    cost_usd: float
    failed_attempts: tuple[str, ...] = ()

    @property
    def met_slo(self) -> bool:
        return self.ttft_s is not None and self.ttft_s * 1000 <= self.request.slo_ttft_ms


class _NoProvider:
    """The planner only reads labels, prices and context sizes; nothing is ever called."""

    name = "simulated"
    capabilities = Capabilities()


def as_target(model: SimTarget, weight: float = 1.0) -> Target:
    provider, _, name = model.label.partition("/")
    return Target(
        alias=ALIAS,
        provider_name=provider,
        model=name,
        provider=_NoProvider(),  # type: ignore[arg-type]
        timeouts=Timeouts(),
        weight=weight,
        price=model.price,
        local=isinstance(model, LocalTier),
        max_context=model.max_context,
    )


class Simulation:
    """Runs ``strategy`` over ``targets`` (in config order) with ``outages``. Each
    simulation owns fresh copies of the targets, so runs never share a local queue."""

    def __init__(
        self,
        targets: Sequence[SimTarget],
        strategy: Strategy,
        outages: Sequence[Outage] = (),
        seed: int = 1,
        weights: dict[str, float] | None = None,
    ) -> None:
        self.models = {m.label: copy.deepcopy(m) for m in targets}
        self.targets = [as_target(m, (weights or {}).get(m.label, 1.0)) for m in targets]
        self.strategy = strategy
        self.outages = list(outages)
        self.seed = seed
        self.rng = random.Random(seed)
        self.board = HealthBoard(list(self.models), self._local_load)

    def _local_load(self, label: str, now_s: float) -> tuple[int, int, bool] | None:
        model = self.models[label]
        if not isinstance(model, LocalTier):
            return None
        running, waiting = model.load(now_s)
        return running, waiting, model.saturated(now_s)

    def run(self, trace: Sequence[SimRequest]) -> list[Outcome]:
        return [self.route(req) for req in trace]

    def route(self, req: SimRequest) -> Outcome:
        """Plan and serve one request (see the module docstring)."""
        self.board.advance(req.arrival_s)
        route = RouteRequest(
            model=ALIAS,
            prompt_tokens=req.prompt_tokens,
            max_tokens=req.max_tokens,
            slo_ttft_ms=req.slo_ttft_ms,
        )
        try:
            plan = plan_route(route, self.targets, self.board, self.strategy, self.rng)
        except InvalidRequestError:  # no target's context window fits
            return Outcome(req, None, None, 0.0)
        ordered = plan.ordered or plan.saturated[:1]  # all saturated: queue on the local tier
        return self._walk(req, ordered, plan.deadlines)

    def _walk(
        self, req: SimRequest, ordered: Sequence[Target], deadlines: Mapping[str, Deadline]
    ) -> Outcome:
        """Serve ``req`` along ``ordered`` as the gateway's executor would: an outage fails
        the attempt after its ``fail_after_s``; an attempt whose first token would come
        after its first-token deadline (``deadlines``, seconds after arrival) is cut there
        and the next target tried, or, with a hedge (first target only), raced against
        the next one from the hedge moment (``_race``)."""
        noise = random.Random(self.seed * 1_000_003 + req.index)
        at_s = req.arrival_s
        failed: list[str] = []
        for target in ordered:
            label = target.label
            deadline = deadlines.get(label)
            window = math.inf if deadline is None else deadline.window_s(at_s - req.arrival_s)
            if window < MIN_ATTEMPT_WINDOW_S:
                continue  # its deadline passed before its turn: skipped, as the executor does
            sent = self.board.started(label, at_s, req.prompt_tokens)
            outage = self._outage(label, at_s)
            if outage is not None:
                at_s += outage.fail_after_s
                self.board.failed(label, sent, at_s)
                failed.append(label)
                continue
            service = self.models[label].serve(at_s, req, noise)
            hedge_s = None if deadline is None else deadline.hedge_window_s(at_s - req.arrival_s)
            if target is ordered[0] and len(ordered) > 1 and hedge_s is not None:
                first = (target, sent, service, at_s + hedge_s)
                late = service.ttft_s > hedge_s
                raced = self._race(req, first, ordered[1], deadlines, noise) if late else None
                if raced is not None:
                    return raced
            if service.ttft_s > window:
                self.board.cut(label, sent, window, req.prompt_tokens)
                at_s += window
                failed.append(label)
                continue
            return self._served(req, target, sent, service, tuple(failed))
        return Outcome(req, None, None, 0.0, tuple(failed))

    def _race(
        self,
        req: SimRequest,
        first: tuple[Target, Sent, Service, float],
        backup: Target,
        deadlines: Mapping[str, Deadline],
        noise: random.Random,
    ) -> Outcome | None:
        """The first target's hedge (``routers.hedge.race``): ``first`` is (target, its
        attempt, its service, the hedge moment). ``backup`` starts at the hedge moment and
        the first to answer serves; the loser is stopped (a primary that lost: a cut at
        that moment; a backup: cancelled). None when the backup may not start (its own
        deadline passed, or in an outage: the executor's refusal), so the first is cut as
        usual. Like a cut attempt, the loser costs nothing here (decision 0010)."""
        target, sent, service, hedge_at = first
        deadline = deadlines.get(backup.label)
        elapsed = hedge_at - req.arrival_s
        window = math.inf if deadline is None else deadline.window_s(elapsed)
        if window < MIN_ATTEMPT_WINDOW_S or self._outage(backup.label, hedge_at) is not None:
            return None
        other = self.board.started(backup.label, hedge_at, req.prompt_tokens)
        rival = self.models[backup.label].serve(hedge_at, req, noise)
        own_at, rival_at = sent.start_s + service.ttft_s, hedge_at + rival.ttft_s
        if rival.ttft_s > window:  # the backup cut at its own deadline: the first goes on
            self.board.cut(backup.label, other, window, req.prompt_tokens)
            rival_at = math.inf
        if own_at <= rival_at:
            if rival_at < math.inf:
                self.board.cancelled(backup.label, other, own_at)
            return self._served(req, target, sent, service, ())
        self.board.cut(target.label, sent, rival_at - sent.start_s, req.prompt_tokens)
        return self._served(req, backup, other, rival, (target.label,))

    def _outage(self, label: str, at_s: float) -> Outage | None:
        """The outage ``label`` is in at ``at_s``, if any."""
        return next((o for o in self.outages if o.down(label, at_s)), None)

    def _served(
        self, req: SimRequest, target: Target, sent: Sent, service: Service, failed: tuple[str, ...]
    ) -> Outcome:
        """Record ``target``'s answer to ``req`` (attempt ``sent``) and its outcome."""
        end_s = sent.start_s + service.total_s(req.output_tokens)
        self.board.succeeded(
            target.label,
            sent,
            service.ttft_s,
            service.tpot_s,
            end_s,
            req.prompt_tokens,
            req.output_tokens,
        )
        ttft = sent.start_s - req.arrival_s + service.ttft_s
        return Outcome(req, target.label, ttft, service.cost_usd, failed)
