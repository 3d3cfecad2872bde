"""Route explain: the ordered plan the planner makes for a request of a given shape (alias,
tenant, prompt size, TTFT objective), with the strategy's reason for each place and why
the other targets were left out. ``switchyard route explain`` runs it with no health data;
the admin console's routing page with this replica's live health."""

from __future__ import annotations

import random

import msgspec

from core.config import Config
from core.routing import UNKNOWN, HealthView, RouteRequest, TargetHealth
from gateway.process.runtime import Runtime
from gateway.request.routing_view import tenant_constraints
from routers.planner import plan_route


class _NoHealthData:
    def health(self, label: str) -> TargetHealth:
        return UNKNOWN


NO_HEALTH_DATA: HealthView = _NoHealthData()


class Explanation(msgspec.Struct, frozen=True, kw_only=True):
    """The plan for one alias: ``ordered`` (label, the strategy's reason) in the order the
    gateway would try them, ``skipped`` (label, why) for the targets left out."""

    model: str
    strategy: str
    ordered: list[tuple[str, str]]
    skipped: list[tuple[str, str]]


def explain_route(
    runtime: Runtime, route: RouteRequest, health: HealthView, seed: int = 0
) -> Explanation:
    """What ``runtime``'s planner does with ``route`` given ``health`` (``NO_HEALTH_DATA``:
    every breaker closed, nothing measured). Raises what the planner raises: 404 for an
    unknown alias, 400 when no target could ever serve the request (its context)."""
    targets, skipped = runtime.plan_for(route.model)
    strategy = runtime.strategies[route.model]
    plan = plan_route(route, targets, health, strategy, random.Random(seed), None)
    return Explanation(
        model=route.model,
        strategy=type(runtime.config.models[route.model].strategy).__name__,
        ordered=[(t.label, plan.reasons.get(t.label, "")) for t in plan.ordered],
        skipped=[(item.label, item.reason) for item in [*skipped, *plan.skipped]],
    )


def route_for(
    config: Config,
    model: str,
    tenant_name: str | None = None,
    *,
    prompt_tokens: int = 500,
    max_tokens: int | None = None,
    slo_ttft_ms: float | None = None,
) -> RouteRequest:
    """The routing view of a request for alias ``model`` by ``tenant_name``: the TTFT
    objective given, else the tenant's, else the alias's; the tenant's residency and
    provider lists. ``ValueError`` naming an unknown alias or tenant."""
    if model not in config.models:
        raise ValueError(f"unknown model alias '{model}'")
    tenant = config.tenants.get(tenant_name) if tenant_name else None
    if tenant_name and tenant is None:
        raise ValueError(f"unknown tenant '{tenant_name}'")
    alias = config.models[model]
    slo = slo_ttft_ms or (tenant.slo_ttft_ms if tenant else None) or alias.slo_ttft_ms
    return RouteRequest(
        model=model,
        tenant=tenant_name or None,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        slo_ttft_ms=slo,
        slo_total_ms=alias.slo_total_ms,
        **tenant_constraints(tenant),
    )
