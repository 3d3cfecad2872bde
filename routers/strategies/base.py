"""The strategy contract: order the candidates that survived the filters, with a short
human reason for each place.

A strategy is pure: no I/O, no clock, randomness only from the ``rng`` it is handed, so a
seeded ``random.Random`` replays a decision exactly (tests, the routing simulator). The only
state a strategy may keep is its own bookkeeping (round robin's turn counter).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from msgspec import Struct

from core.routing import HealthView, RouteRequest
from routers.strategies.deadlines import Deadline
from routers.targets import Target


class Ranked(Struct, frozen=True):
    """One place in a plan: the target and why it sits there (shown in
    ``x-switchyard-route-reason`` when it serves); ``deadline`` overrides the target's
    first-token deadline (``routers.strategies.deadlines``)."""

    target: Target
    reason: str
    deadline: Deadline | None = None


class Strategy(Protocol):
    """Orders candidates. ``plan`` returns every candidate exactly once (a permutation);
    the planner has already removed the ones that must not be tried."""

    name: str

    def plan(
        self,
        req: RouteRequest,
        candidates: Sequence[Target],
        health: HealthView,
        rng: random.Random,
    ) -> list[Ranked]: ...


def ordinal(place: int) -> str:
    """``#1``, ``#2`` ... for reasons (``place`` counts from 0)."""
    return f"#{place + 1}"
