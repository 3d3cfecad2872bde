"""Routing simulator: cost per 1,000 requests and TTFT-SLO attainment per policy.

Run: .venv/bin/python -m bench.simulator --requests 20000 --seed 1
     [--rate 4] [--outage vendor/mid:0.40:0.45 | --outage none]

The outage is given as label:start:end with start/end as fractions of the trace's span.
Deterministic for a seed. Not a test: it prints figures (bench/ is never pass/fail).
"""

from __future__ import annotations

import argparse
import time

from bench.simulator.policies import ALL, run_all
from bench.simulator.report import table, verdict
from bench.simulator.targets import Outage, default_targets
from bench.simulator.trace import MIXED, make_trace


def parse_outage(text: str, span_s: float) -> list[Outage]:
    if text == "none":
        return []
    label, start, end = text.rsplit(":", 2)
    return [Outage(label, float(start) * span_s, float(end) * span_s)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.simulator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=4.0, help="arrivals per second")
    parser.add_argument("--outage", default="vendor/mid:0.40:0.45")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    trace = make_trace(args.requests, args.rate, args.seed)
    span = trace[-1].arrival_s if trace else 0.0
    outages = parse_outage(args.outage, span)
    summaries = run_all(default_targets(), trace, outages, args.seed)
    mix = ", ".join(f"{c.name} {100 * c.share:.0f}% (TTFT <= {c.slo_ttft_ms:g} ms)" for c in MIXED)
    print(f"{args.requests} requests over {span / 3600:.2f} h at {args.rate:g}/s, seed {args.seed}")
    print(f"mix: {mix}")
    print(
        "outages: "
        + (", ".join(f"{o.label} {o.start_s:.0f}-{o.end_s:.0f}s" for o in outages) or "none")
    )
    print()
    print(table(summaries, ALL))
    print()
    by_name = {s.policy: s for s in summaries}
    print(verdict(by_name["slo"], by_name["always-premium"]))
    print(f"({time.perf_counter() - started:.1f}s)")


if __name__ == "__main__":
    main()
