"""Where one policy's misses over another's come from: requests with an objective paired
by (seed, request) across the two policies' runs of the same trace, each miss of one
policy that the other met counted by kind.

Contract (pure): ``excess(metrics)``, over the ``misses`` of ``report.run_metrics``
(``report.miss_kinds``: start-up, after a cut, first attempt) -> per feed and policy
with ``slo`` in its name, against ``priority``: misses of both, of the baseline only,
and of the policy only by kind. Why: the verdict's
difference says how far a policy is behind, not why; the pairing (the upstreams' latency
draws are the same for a request whatever the policy) separates what the policy added
from the upstreams' own tail, which no policy could avoid (decision 0010, session 22)."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

from bench.routing_e2e.report import KINDS


def excess(metrics: list[dict[str, Any]], baseline: str = "priority") -> list[dict[str, Any]]:
    """Per feed and policy: ``both``, ``baseline_only`` and ``policy_only`` (by kind),
    over the seeds both policies ran (``misses`` of ``report.run_metrics``)."""
    runs = {(m["seed"], m["feed"], m["policy"]): m for m in metrics}
    feeds = sorted({m["feed"] for m in metrics})
    policies = sorted({m["policy"] for m in metrics if "slo" in m["policy"]})
    out = []
    for feed, policy in itertools.product(feeds, policies):
        both, base_only, own = 0, 0, Counter[str]()
        seeds = sorted(s for s, f, p in runs if f == feed and p == policy)
        paired = [s for s in seeds if (s, feed, baseline) in runs]
        for seed in paired:
            mine = dict(runs[(seed, feed, policy)]["misses"])
            theirs = {i for i, _ in runs[(seed, feed, baseline)]["misses"]}
            both += len(mine.keys() & theirs)
            base_only += len(theirs - mine.keys())
            own.update(kind for i, kind in mine.items() if i not in theirs)
        if paired:
            out.append(
                {
                    "feed": feed,
                    "policy": policy,
                    "baseline": baseline,
                    "both": both,
                    "baseline_only": base_only,
                    "policy_only": {kind: own[kind] for kind in KINDS},
                }
            )
    return out


def excess_lines(items: list[dict[str, Any]]) -> str:
    """One printed line per item of ``excess``."""
    lines = []
    for e in items:
        own = e["policy_only"]
        kinds = ", ".join(f"{kind} {own[kind]}" for kind in KINDS)
        lines.append(
            f"misses [{e['feed']}] {e['policy']} vs {e['baseline']}: {sum(own.values())} "
            f"{e['policy']} only ({kinds}), {e['baseline_only']} {e['baseline']} only, "
            f"{e['both']} both"
        )
    return "\n".join(lines)
