"""``python -m bench.routing_e2e``: replay seeded traces through real gateways, one per
routing policy, against fake upstreams; print the table, the slo-vs-priority verdict and
where slo's misses over priority come from (``bench.routing_e2e.excess``).

Contract: prints the expected and the longest duration first, runs every (seed, feed)
group in turn (the policies of a group side by side), stops by itself, and writes per-seed
and aggregated figures to ``--json`` when given. Exit code 0 whatever the verdict.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from bench.routing_e2e import report
from bench.routing_e2e.excess import excess, excess_lines
from bench.routing_e2e.menu import ORDER
from bench.routing_e2e.runner import POLICIES, PolicyRun, Settings, run_group

FEEDS = {"both": ("none", "metrics"), "none": ("none",), "metrics": ("metrics",)}


def parse_args(
    argv: list[str] | None = None,
) -> tuple[Settings, Path | None, Path | None, Path | None]:
    p = argparse.ArgumentParser(prog="python -m bench.routing_e2e", description=__doc__)
    p.add_argument("--seeds", default="1,2,3", help="comma-separated trace seeds")
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--rate", type=float, default=6.0, help="Poisson arrivals per second")
    p.add_argument("--feed", choices=sorted(FEEDS), default="both", help="local box metrics feed")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--outage", default="mid", choices=ORDER, help="upstream that hangs")
    p.add_argument("--outage-s", type=float, default=20.0)
    p.add_argument("--scale", type=float, default=1.0, help="multiply upstream latencies")
    p.add_argument("--client-timeout", type=float, default=150.0)
    p.add_argument("--parallel", type=int, default=5, help="policies side by side")
    p.add_argument("--workdir", type=Path, help="keep gateway configs and logs here")
    p.add_argument("--json", type=Path, help="write per-seed and aggregated figures here")
    p.add_argument(
        "--requests-out", type=Path, help="write one JSON line per request (route reasons)"
    )
    p.add_argument(
        "--health-out",
        type=Path,
        help="write one JSON line per target and second: the gateway's view (/admin/targets)",
    )
    a = p.parse_args(argv)
    settings = Settings(
        seeds=tuple(int(s) for s in a.seeds.split(",") if s),
        requests=a.requests,
        rate=a.rate,
        feeds=FEEDS[a.feed],
        policies=tuple(x for x in a.policies.split(",") if x),
        outage_upstream=a.outage,
        outage_s=a.outage_s,
        scale=a.scale,
        client_timeout_s=a.client_timeout,
        parallel=a.parallel,
        workdir=a.workdir,
    )
    for policy in settings.policies:
        if policy not in POLICIES:
            p.error(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    return settings, a.json, a.requests_out, a.health_out


def write_requests(path: Path, runs: list[PolicyRun]) -> None:
    """One JSON line per request and policy: what was asked, who served, why, how fast."""
    with path.open("w") as out:
        for run in runs:
            for req, got in zip(run.trace, run.outcomes, strict=True):
                line = {
                    "seed": run.seed,
                    "feed": run.feed,
                    "policy": run.policy,
                    "index": req.index,
                    "at_s": round(req.at_s, 3),
                    "class": req.slo_class,
                    "prompt_tokens": req.prompt_tokens,
                    "provider": got.provider,
                    "ttft_s": got.ttft_s,
                    "attempts": got.attempts,
                    "reason": got.reason,
                    "error": got.error,
                }
                out.write(json.dumps(line) + "\n")


def write_health(path: Path, runs: list[PolicyRun]) -> None:
    """One JSON line per policy run, target and poll: the health the strategy routed on."""
    with path.open("w") as out:
        for run in runs:
            for sample in run.health:
                line = {"seed": run.seed, "feed": run.feed, "policy": run.policy}
                line |= {"at_s": sample.at_s, "target": sample.target, **sample.health}
                out.write(json.dumps(line) + "\n")


async def run_all(settings: Settings, log: Any = print) -> list[PolicyRun]:
    """Every (seed, feed) group in turn; ``log`` gets one line per group."""
    runs: list[PolicyRun] = []
    for seed in settings.seeds:
        for feed in settings.feeds:
            began = time.monotonic()
            group = await run_group(seed, feed, settings)
            runs += group
            errors = sum(not o.ok for r in group for o in r.outcomes)
            lag = group[0].loop_lag_s.get("p99", 0.0) if group else 0.0
            log(
                f"seed {seed} feed {feed}: {time.monotonic() - began:.0f}s, {errors} errors, "
                f"harness loop lag p99 {lag * 1000:.0f} ms"
            )
    return runs


def build_report(settings: Settings, runs: list[PolicyRun]) -> dict[str, Any]:
    """Per-seed metrics, aggregates, verdicts and the configs (JSON-able)."""
    metrics = [report.run_metrics(r) for r in runs]
    agg = report.aggregate(metrics)
    return {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(settings).items()},
        "per_seed": metrics,
        "aggregate": agg,
        "verdicts": report.verdicts(agg, metrics),
        "excess_misses": excess(metrics),
        "configs": {
            f"{r.seed}/{r.feed}/{r.policy}": r.config
            for r in runs[: len(settings.policies) * len(settings.feeds)]
        },
    }


def main(argv: list[str] | None = None) -> int:
    settings, out, requests_out, health_out = parse_args(argv)
    groups = len(settings.seeds) * len(settings.feeds)
    print(
        f"routing_e2e: {groups} group(s) x {len(settings.policies)} policies side by side, "
        f"{settings.requests} requests at {settings.rate:g}/s; expected ~{groups * settings.typical_s() / 60:.1f} min, "
        f"at most {groups * settings.bound_s() / 60:.1f} min",
        flush=True,
    )
    began = time.monotonic()
    try:
        import uvloop  # lower per-event cost: the harness's loop lag is TTFT error

        uvloop.install()
    except ImportError:
        pass
    runs = asyncio.run(run_all(settings, lambda line: print(line, flush=True)))
    result = build_report(settings, runs)
    print(report.table(result["aggregate"]))
    print("cells: attainment % ± SE (across seeds; binomial with one seed); TTFT in s")
    print(report.verdict_lines(result["verdicts"]))
    print(excess_lines(result["excess_misses"]))
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    print(
        f"took {time.monotonic() - began:.0f}s; CPU: harness {me.ru_utime + me.ru_stime:.0f}s, "
        f"gateways {kids.ru_utime + kids.ru_stime:.0f}s"
    )
    if out is not None:
        out.write_text(json.dumps(result, indent=2, default=str))
    if requests_out is not None:
        write_requests(requests_out, runs)
    if health_out is not None:
        write_health(health_out, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
