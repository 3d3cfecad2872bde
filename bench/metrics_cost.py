"""CPU per request of the gateway's request metrics (``GatewayMetrics.request_done``) on
the record of one plain, served request: the figure behind issue 12's budget of 0.05 ms.

In process, no server: the same record is counted ``--calls`` times after a warm-up and
this process's CPU time (``time.process_time``) is divided by the calls; the best of
``--rounds`` rounds is printed. For instructions instead of time, run it under
``valgrind --tool=cachegrind`` with two ``--calls`` values and divide the difference.

Run: .venv/bin/python -m bench.metrics_cost [--calls 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

from core.config import parse_config
from core.tenancy import Principal
from core.wire import make_usage
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.record import RequestRecord
from routers.trace import Attempt

CONFIG = parse_config(
    'providers: {a: {type: openai, base_url: "http://127.0.0.1:9/v1"}}\n'
    "models: {chat: {targets: [{provider: a, model: one}]}}\n"
)


def served_record() -> RequestRecord:
    """What a plain chat request served by its first target leaves behind."""
    record = RequestRecord(SimpleNamespace(headers={}, scope={}), "chat")  # type: ignore[arg-type]
    record.started, record.ended = 100.0, 100.3
    record.model = "chat"
    record.principal = Principal(tenant="acme", key_id="k1")
    record.trace.attempts = [Attempt("a/one", None, 100.01, 100.29)]
    record.trace.served_by = SimpleNamespace(label="a/one", provider_name="a", model="one")  # type: ignore[assignment]
    record.usage = make_usage(120, 40)
    record.cost_usd = 0.0002
    return record


def per_call_us(calls: int) -> float:
    metrics, record = GatewayMetrics(), served_record()
    for _ in range(1000):  # warm-up: the label children exist
        metrics.request_done(record, CONFIG, 200, None)
    start = time.process_time()
    for _ in range(calls):
        metrics.request_done(record, CONFIG, 200, None)
    return (time.process_time() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    best = min(per_call_us(args.calls) for _ in range(args.rounds))
    print(f"request metrics: {best:.2f} us CPU per request (best of {args.rounds} x {args.calls})")


if __name__ == "__main__":
    main()
