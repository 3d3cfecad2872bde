"""``switchyard route explain``: the ordered plan for a model alias, with the reason for
each place, computed by the same planner the gateway runs (with no health data yet: every
breaker closed, no latency estimates, local replicas not saturated): the functions of
``gateway.request.explain``, which the admin console's route explain runs too."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from core.clock import SystemClock
from core.config import ConfigError, load_config
from gateway.process.runtime import Runtime, Stores
from gateway.request.explain import NO_HEALTH_DATA, explain_route, route_for
from policies.store import MemoryStore
from providers.transport import make_client


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
    try:
        route = route_for(
            config,
            args.model,
            args.tenant,
            prompt_tokens=args.prompt_tokens,
            max_tokens=args.max_tokens,
            slo_ttft_ms=args.slo_ttft_ms,
        )
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    memory = MemoryStore(SystemClock())
    runtime = Runtime(config, make_client(), stores=Stores(shared=memory, local=memory))
    explained = explain_route(runtime, route, NO_HEALTH_DATA, args.seed)
    print(f"model {args.model} (strategy {explained.strategy}):")
    for place, (label, reason) in enumerate(explained.ordered, 1):
        print(f"  {place}. {label}: {reason}")
    for label, reason in explained.skipped:
        print(f"  -  {label}: skipped ({reason})")
    if not explained.ordered:
        print("  no target can serve this request")
    return 0
