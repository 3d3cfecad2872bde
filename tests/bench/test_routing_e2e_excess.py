"""Where a policy's misses over the baseline's come from: each miss classified
(``bench.routing_e2e.report.miss_kinds``), and pairs counted by seed and request
(``bench.routing_e2e.excess``)."""

from __future__ import annotations

from bench.routing_e2e.client import Outcome
from bench.routing_e2e.excess import excess, excess_lines
from bench.routing_e2e.report import STARTUP_S, miss_kinds
from bench.routing_e2e.runner import PolicyRun
from bench.routing_e2e.workload import TraceRequest


def _req(index: int, at_s: float, slo_class: str = "chat-800ms") -> TraceRequest:
    return TraceRequest(index, f"k{index}", at_s, "chat", slo_class, 100, 10)


def _run(requests: list[tuple[TraceRequest, Outcome]]) -> PolicyRun:
    trace, outcomes = zip(*requests, strict=True)
    return PolicyRun(1, "none", "slo", list(trace), list(outcomes), {}, 100.0, (0.0, 0.0))


def test_each_miss_is_classified_by_when_and_on_which_attempt():
    run = _run(
        [
            (_req(0, 1.0), Outcome(0, 200, ttft_s=0.9, attempts=1)),  # start-up
            (_req(1, STARTUP_S + 1), Outcome(1, 200, ttft_s=0.9, attempts=2)),  # cut
            (_req(2, STARTUP_S + 2), Outcome(2, 200, ttft_s=0.81, attempts=1)),
            (_req(3, STARTUP_S + 3), Outcome(3, 200, ttft_s=0.8, attempts=3)),  # met
            (_req(4, STARTUP_S + 4, "none"), Outcome(4, 200, ttft_s=9.0)),  # no objective
            (_req(5, STARTUP_S + 5, "chat-3s"), Outcome(5, 502, error="upstream")),  # error
        ]
    )
    assert miss_kinds(run) == [
        (0, "start-up"),
        (1, "after a cut"),
        (2, "first attempt"),
        (5, "first attempt"),
    ]


def _metrics(seed: int, policy: str, misses: list[tuple[int, str]]) -> dict:
    return {"seed": seed, "feed": "none", "policy": policy, "misses": misses}


def test_pairs_count_by_seed_and_request_and_only_paired_seeds():
    metrics = [
        _metrics(1, "priority", [(3, "first attempt"), (7, "first attempt")]),
        _metrics(1, "slo", [(3, "first attempt"), (4, "start-up"), (9, "after a cut")]),
        _metrics(2, "priority", [(4, "first attempt")]),  # seed 2: request 4 is another one
        _metrics(2, "slo", [(5, "after a cut")]),
        _metrics(3, "slo", [(1, "start-up")]),  # no priority run of seed 3: left out
        _metrics(1, "lowest_cost", [(1, "start-up")]),  # not an slo policy
    ]
    (item,) = excess(metrics)
    assert item["both"] == 1 and item["baseline_only"] == 2
    assert item["policy_only"] == {"start-up": 1, "after a cut": 2, "first attempt": 0}
    assert excess_lines([item]) == (
        "misses [none] slo vs priority: 3 slo only (start-up 1, after a cut 2, first "
        "attempt 0), 2 priority only, 1 both"
    )
