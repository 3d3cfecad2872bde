"""Routing strategies, one small class per ``ModelConfig.strategy`` kind.

``build_strategy(config)`` makes the strategy for one alias; ``strategy.plan(req,
candidates, health, rng) -> list[Ranked]`` orders the filtered candidates (pure; see
``base``). Prediction helpers shared with the simulator live in ``predict``.
"""

from __future__ import annotations

from typing import Any

from core.config_routing import (
    LeastLatencyStrategy,
    LowestCostStrategy,
    PrefixAwareStrategy,
    PriorityStrategy,
    RoundRobinStrategy,
    SloStrategy,
    StrategyConfig,
    WeightedStrategy,
)
from routers.strategies.base import Ranked, Strategy
from routers.strategies.least_latency import LeastLatency
from routers.strategies.lowest_cost import LowestCost
from routers.strategies.prefix_aware import PrefixAware
from routers.strategies.priority import Priority
from routers.strategies.round_robin import RoundRobin
from routers.strategies.slo import Slo
from routers.strategies.weighted import Weighted

_BUILDERS: dict[type[Any], Any] = {
    PriorityStrategy: Priority,
    WeightedStrategy: Weighted,
    LeastLatencyStrategy: LeastLatency,
    LowestCostStrategy: LowestCost,
    SloStrategy: Slo,
    PrefixAwareStrategy: PrefixAware,
    RoundRobinStrategy: RoundRobin,
}


def build_strategy(config: StrategyConfig) -> Strategy:
    """A fresh strategy for one alias from its config (a new instance per alias and per
    reload, so stateful ones such as round robin never share a counter)."""
    builder = _BUILDERS.get(type(config))
    if builder is None:
        raise TypeError(f"no routing strategy for {type(config).__name__}")
    strategy: Strategy = builder(config)
    return strategy


__all__ = [
    "LeastLatency",
    "LowestCost",
    "PrefixAware",
    "Priority",
    "Ranked",
    "RoundRobin",
    "Slo",
    "Strategy",
    "Weighted",
    "build_strategy",
]
