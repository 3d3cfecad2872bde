"""What happened to one request on its way through its plan: the attempts, the targets
skipped and why, the strategy's reasons, the target that served, a hedge race; and the
short human reason sent as ``x-switchyard-route-reason``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from msgspec import Struct

from routers.targets import Skipped, Target

if TYPE_CHECKING:
    from routers.planner import Plan


class Attempt(Struct, frozen=True):
    """One call to one target. ``started``/``ended``: the executor's clock (monotonic
    seconds) when the call began and when it answered (a stream: its first chunk) or
    failed; they time the attempt's span and its upstream-latency sample."""

    label: str
    error: str | None = None  # the error class name, None for success
    started: float = 0.0
    ended: float = 0.0


class Trace:
    """What happened to one request on its way through the plan. ``reasons`` are the
    strategy's reasons per target label (``Plan.reasons``)."""

    def __init__(
        self, skipped: Sequence[Skipped] = (), reasons: Mapping[str, str] | None = None
    ) -> None:
        self.attempts: list[Attempt] = []
        self.skipped = list(skipped)
        self.reasons = dict(reasons or {})
        self.served_by: Target | None = None
        self.hedge: tuple[Target, Target] | None = None  # (first, second) when hedged

    @classmethod
    def from_plan(cls, plan: Plan, skipped: Sequence[Skipped] = ()) -> Trace:
        """A trace that starts with ``skipped`` (e.g. disabled providers) and the plan's
        own skips and reasons."""
        return cls([*skipped, *plan.skipped], plan.reasons)

    @property
    def fallbacks(self) -> int:
        """How many targets were given up on before the one that served (or the last one)."""
        labels = {attempt.label for attempt in self.attempts}
        return max(0, len(labels) - 1)

    @property
    def hedge_loser(self) -> Target | None:
        """The target that lost a hedge race (the served one's rival), else None."""
        if self.hedge is None or self.served_by is None:
            return None
        first, second = self.hedge
        return second if self.served_by.label == first.label else first

    def route_reason(self) -> str:
        """A short human reason, sent as ``x-switchyard-route-reason``: the strategy's reason
        for the target that served, the targets that failed before it (and, in the order
        they were tried, the strategy's reason for each), the skipped ones."""
        if self.served_by is None:
            return "no target succeeded"
        served = self.served_by.label
        failed = list(
            dict.fromkeys(a.label for a in self.attempts if a.error and a.label != served)
        )
        parts = [self.reasons[served]] if served in self.reasons else []
        if failed:
            parts.append(f"fallback after {', '.join(sorted(failed))} failed")
            # why each was tried: the first question about a fallback
            parts.extend(
                f"tried {label} ({self.reasons[label]})"
                for label in failed
                if label in self.reasons
            )
        if not parts:
            parts.append("priority: first available target")
        if (loser := self.hedge_loser) is not None:
            parts.append(f"hedged, {loser.label} lost")
        if self.skipped:
            parts.append("skipped " + ", ".join(f"{s.label} ({s.reason})" for s in self.skipped))
        return "; ".join(parts)
