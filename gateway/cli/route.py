"""``switchyard route explain``: the ordered plan for a model alias, with the reason for
each place, computed by the same planner the gateway runs (with no health data yet: every
breaker closed, no latency estimates, local replicas not saturated)."""

from __future__ import annotations

import argparse
import random
import sys
from typing import Any

from core.clock import SystemClock
from core.config import ConfigError, load_config
from core.routing import UNKNOWN, RouteRequest, TargetHealth
from gateway.process.runtime import Runtime, Stores
from gateway.request.routing_view import tenant_constraints
from policies.store import MemoryStore
from providers.transport import make_client
from routers.planner import plan_route


class _NoHealthData:
    def health(self, label: str) -> TargetHealth:
        return UNKNOWN


def add_parser(commands: Any) -> None:
    route = commands.add_parser("route", help="explain routing decisions")
    actions = route.add_subparsers(dest="route_command", required=True)
    explain = actions.add_parser("explain", help="print the ordered plan for a model alias")
    explain.add_argument("--config", help="policy file (default: as for serve)")
    explain.add_argument("--model", required=True, help="model alias")
    explain.add_argument("--tenant", help="tenant (its residency and SLO apply)")
    explain.add_argument("--prompt-tokens", type=int, default=500)
    explain.add_argument("--max-tokens", type=int, default=None)
    explain.add_argument("--slo-ttft-ms", type=float, default=None)
    explain.add_argument("--seed", type=int, default=0, help="for the randomised strategies")


def run(args: argparse.Namespace, config_path: str) -> int:
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        for error in exc.errors:
            print(f"{config_path}: {error}", file=sys.stderr)
        return 1
    if args.model not in config.models:
        print(f"unknown model alias '{args.model}'", file=sys.stderr)
        return 1
    tenant = config.tenants.get(args.tenant) if args.tenant else None
    if args.tenant and tenant is None:
        print(f"unknown tenant '{args.tenant}'", file=sys.stderr)
        return 1
    model = config.models[args.model]
    slo = args.slo_ttft_ms or (tenant.slo_ttft_ms if tenant else None) or model.slo_ttft_ms
    route = RouteRequest(
        model=args.model,
        tenant=args.tenant,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        slo_ttft_ms=slo,
        slo_total_ms=model.slo_total_ms,
        **tenant_constraints(tenant),
    )
    memory = MemoryStore(SystemClock())
    runtime = Runtime(config, make_client(), stores=Stores(shared=memory, local=memory))
    targets, skipped = runtime.plan_for(args.model)
    strategy = runtime.strategies[args.model]
    plan = plan_route(route, targets, _NoHealthData(), strategy, random.Random(args.seed), None)
    print(f"model {args.model} (strategy {type(model.strategy).__name__}):")
    for place, target in enumerate(plan.ordered, 1):
        print(f"  {place}. {target.label}: {plan.reasons.get(target.label, '')}")
    for item in [*skipped, *plan.skipped]:
        print(f"  -  {item.label}: skipped ({item.reason})")
    if not plan.ordered:
        print("  no target can serve this request")
    return 0
