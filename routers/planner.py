"""The planner: filters first, then the alias's strategy. Pure and synchronous.

Filter order matters and is fixed:
1. data residency (``req.local_only``) and the tenant's provider allow/deny lists, on the
   whole candidate list, so no later step and no fallback can reach a target they exclude;
2. capabilities (400 when no target can express the request);
3. context window (400 ``context_length_exceeded`` when no target fits);
4. health: open breakers ("circuit open") and saturated local replicas ("saturated", also
   kept in ``Plan.saturated`` so the caller can queue for them).
Then the strategy orders the survivors, and each planned target but the last gets its
first-token deadline (``routers.strategies.deadlines``) when the request has a TTFT objective.
The 400s come before the health filters on purpose: a request no target could ever serve
is the client's problem, not an outage.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from msgspec import Struct, field

from core.routing import HealthView, RouteRequest
from core.wire import ChatRequest
from routers.filters import (
    filter_capable,
    filter_context,
    filter_health,
    filter_local,
    filter_tenant,
)
from routers.strategies.base import Strategy
from routers.strategies.deadlines import Deadline, first_token_deadlines
from routers.targets import Skipped, Target


class Plan(Struct, kw_only=True):
    """Targets to try in order, the ones left out and why, each planned target's strategy
    reason (by label) for ``x-switchyard-route-reason``, and the first-token deadlines of
    streamed attempts (``routers.strategies.deadlines``, by label)."""

    ordered: list[Target]
    skipped: list[Skipped] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    saturated: list[Target] = field(default_factory=list)
    deadlines: dict[str, Deadline] = field(default_factory=dict)


def plan_route(
    req: RouteRequest,
    targets: Sequence[Target],
    health: HealthView,
    strategy: Strategy,
    rng: random.Random,
    needs: ChatRequest | None = None,
) -> Plan:
    """Filter ``targets`` for ``req`` and order the survivors with ``strategy``.

    ``needs`` is the full chat request when capabilities must be checked (None for
    endpoints without capability needs). Every target ends up in exactly one of
    ``ordered`` or ``skipped``; ``ordered`` never holds a target that is not in ``targets``.
    Raises ``InvalidRequestError``/``ContextLengthError`` as the filters do.
    """
    skipped: list[Skipped] = []
    kept = list(targets)
    if req.local_only:
        kept, dropped = filter_local(kept)
        skipped += dropped
    if req.providers is not None or req.deny_providers:
        kept, dropped = filter_tenant(req.providers, req.deny_providers, kept)
        skipped += dropped
    if needs is not None:
        kept, dropped = filter_capable(needs, kept)
        skipped += dropped
    # Only an explicit max_tokens counts here: without one, upstreams stop at their limit.
    kept, dropped = filter_context(req.prompt_tokens, req.max_tokens or 0, kept)
    skipped += dropped
    kept, dropped, saturated = filter_health(kept, health)
    skipped += dropped
    ranked = strategy.plan(req, kept, health, rng) if kept else []
    ordered = [r.target for r in ranked]
    deadlines = first_token_deadlines(req, ordered, health)
    deadlines.update({r.target.label: r.deadline for r in ranked if r.deadline is not None})
    return Plan(
        ordered=ordered,
        skipped=skipped,
        reasons={r.target.label: r.reason for r in ranked},
        saturated=saturated,
        deadlines=deadlines,
    )
