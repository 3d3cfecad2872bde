"""The policies compared: a strategy and the targets it may use, in config order.

Every policy but ``always-premium`` routes over the same four targets listed cheapest
first (local, cheap, mid, premium), so ``priority`` means "local first, then the hosted
models from cheap to dear". ``always-premium`` sends everything to the premium model, with
the mid model as its fallback (what any real configuration would have).
``prefix_aware`` is left out: it ranks replicas of one local model by cached prefix and
queue, which says nothing on a trace without shared prefixes and mixed vendors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.simulator.engine import Simulation
from bench.simulator.report import Summary, summarise
from bench.simulator.targets import LocalTier, Outage, SimTarget
from bench.simulator.trace import SimRequest
from core.config_routing import (
    LeastLatencyStrategy,
    LowestCostStrategy,
    PriorityStrategy,
    RoundRobinStrategy,
    SloStrategy,
    StrategyConfig,
    WeightedStrategy,
)
from routers.strategies import build_strategy

ALL = ("local/small", "vendor/cheap", "vendor/mid", "vendor/premium")
WEIGHTS = {"local/small": 4.0, "vendor/cheap": 2.0, "vendor/mid": 2.0, "vendor/premium": 1.0}


@dataclass(frozen=True)
class Policy:
    name: str
    strategy: StrategyConfig
    labels: tuple[str, ...] = ALL


POLICIES = (
    Policy("always-premium", PriorityStrategy(), ("vendor/premium", "vendor/mid")),
    Policy("priority", PriorityStrategy()),
    Policy("weighted", WeightedStrategy()),
    Policy("round_robin", RoundRobinStrategy()),
    Policy("least_latency", LeastLatencyStrategy()),
    Policy("lowest_cost", LowestCostStrategy()),
    Policy("slo", SloStrategy()),
)


def run_policy(
    policy: Policy,
    targets: Sequence[SimTarget],
    trace: Sequence[SimRequest],
    outages: Sequence[Outage],
    seed: int,
) -> Summary:
    """Simulate ``policy`` over ``trace`` and summarise it."""
    by_label = {t.label: t for t in targets}
    chosen = [by_label[label] for label in policy.labels]
    simulation = Simulation(chosen, build_strategy(policy.strategy), outages, seed, WEIGHTS)
    outcomes = simulation.run(trace)
    locals_ = [t for t in chosen if isinstance(t, LocalTier)]
    hours = (trace[-1].arrival_s if trace else 0.0) / 3600.0
    fixed = sum(t.hourly_usd for t in locals_) * hours
    return summarise(policy.name, outcomes, {t.label for t in locals_}, fixed)


def run_all(
    targets: Sequence[SimTarget],
    trace: Sequence[SimRequest],
    outages: Sequence[Outage],
    seed: int,
    policies: Sequence[Policy] = POLICIES,
) -> list[Summary]:
    return [run_policy(p, targets, trace, outages, seed) for p in policies]
