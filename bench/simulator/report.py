"""Figures per policy: cost per 1,000 requests, SLO attainment (overall and per class),
fallbacks, failures, and where the requests went."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from bench.simulator.engine import Outcome


@dataclass(frozen=True)
class Summary:
    """One policy's result. ``cost_usd`` is the sum of the per-request costs (the local
    tier priced per token from its hourly price, as the strategies see it);
    ``billed_usd`` instead bills the local tier for every simulated hour it was provisioned
    (``fixed_usd``) plus the hosted models' token costs."""

    policy: str
    requests: int
    cost_usd: float
    billed_usd: float
    slo_met: int
    per_class: dict[str, tuple[int, int]]  # class -> (met, requests)
    fallbacks: int
    failed: int
    served: dict[str, int]

    @property
    def cost_per_1k(self) -> float:
        return 1000.0 * self.cost_usd / self.requests if self.requests else 0.0

    @property
    def billed_per_1k(self) -> float:
        return 1000.0 * self.billed_usd / self.requests if self.requests else 0.0

    @property
    def attainment(self) -> float:
        return self.slo_met / self.requests if self.requests else 0.0


def summarise(
    policy: str, outcomes: Sequence[Outcome], local_labels: set[str], fixed_usd: float
) -> Summary:
    """Aggregate ``outcomes``; ``fixed_usd`` is the hourly bill of the local tier for the
    trace's duration (0 when the policy has no local target)."""
    classes: dict[str, list[int]] = {}
    for outcome in outcomes:
        tally = classes.setdefault(outcome.request.klass, [0, 0])
        tally[0] += outcome.met_slo
        tally[1] += 1
    hosted = sum(o.cost_usd for o in outcomes if o.served_by not in local_labels)
    return Summary(
        policy=policy,
        requests=len(outcomes),
        cost_usd=sum(o.cost_usd for o in outcomes),
        billed_usd=hosted + fixed_usd,
        slo_met=sum(o.met_slo for o in outcomes),
        per_class={k: (v[0], v[1]) for k, v in classes.items()},
        fallbacks=sum(1 for o in outcomes if o.failed_attempts and o.served_by is not None),
        failed=sum(1 for o in outcomes if o.served_by is None),
        served=dict(Counter(o.served_by or "-" for o in outcomes)),
    )


def table(summaries: Sequence[Summary], labels: Sequence[str]) -> str:
    """A fixed-width table, one row per policy."""
    classes = sorted({k for s in summaries for k in s.per_class})
    short = [label.split("/")[-1] for label in labels]
    head = (
        f"{'policy':<15}{'$/1k req':>10}{'$/1k billed':>12}{'SLO met':>9}"
        + "".join(f"{k[:9]:>10}" for k in classes)
        + f"{'fallback':>9}{'failed':>7}  share "
        + "/".join(short)
    )
    rows = [head, "-" * len(head)]
    for s in summaries:
        per_class = "".join(
            f"{100.0 * s.per_class[k][0] / max(1, s.per_class[k][1]):>9.1f}%" for k in classes
        )
        share = "/".join(
            f"{100.0 * s.served.get(label, 0) / max(1, s.requests):.0f}" for label in labels
        )
        rows.append(
            f"{s.policy:<15}{s.cost_per_1k:>10.3f}{s.billed_per_1k:>12.3f}"
            f"{100.0 * s.attainment:>8.1f}%{per_class}{s.fallbacks:>9}{s.failed:>7}"
            f"  {share}"
        )
    return "\n".join(rows)


def verdict(slo: Summary, premium: Summary) -> str:
    """The headline: is ``slo`` at least 40% cheaper than always-premium at equal or better
    SLO attainment (on both cost measures)?"""
    saving = 1.0 - slo.cost_usd / premium.cost_usd if premium.cost_usd else 0.0
    billed = 1.0 - slo.billed_usd / premium.billed_usd if premium.billed_usd else 0.0
    ok = saving >= 0.4 and billed >= 0.4 and slo.attainment >= premium.attainment
    return (
        f"slo vs always-premium: {100 * saving:.0f}% cheaper per request "
        f"({100 * billed:.0f}% on the hourly-billed measure), SLO met "
        f"{100 * slo.attainment:.1f}% vs {100 * premium.attainment:.1f}%"
        f" -> target {'met' if ok else 'NOT met'}"
    )
