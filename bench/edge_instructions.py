"""Instructions per request of the gateway application, counted by valgrind (cachegrind):
a deterministic A/B figure for the edge where CPU time on a shared VM is too noisy.

Each run drives the app in-process (``bench.edge_cpu.rounds``, the fast fake upstream in
another process) with logging configured as ``switchyard serve`` does (JSON, to
/dev/null), once with ``--few`` and once with ``--many`` requests; instructions per
request = (I(many) - I(few)) / (many - few), which cancels start-up and warm-up. The
disconnect watcher is pushed out of reach (valgrind slows requests past its 50 ms delay;
a real request that quick never starts it).

Run from the tree to measure (``apt-get install valgrind``):
    .venv/bin/python -m bench.edge_instructions [--dialect chat] [--few 50] [--many 450]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTRA_ENV = "SWITCHYARD_BENCH_CONFIG_EXTRA"  # YAML the driver appends to its config


def drive(port: int, count: int, dialect: str) -> None:
    """The measured process: ``count`` sequential requests of ``dialect``."""
    from bench import edge_cpu
    from core.config import LoggingConfig
    from gateway.http import abandon
    from gateway.process.observe import configure_logging

    abandon.WATCH_AFTER_S = 1000.0
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the whole process
    configure_logging(LoggingConfig(level="info", json=True))
    asyncio.run(edge_cpu.rounds(port, [dialect], count, 1, os.environ.get(EXTRA_ENV, "")))


def instructions(port: int, count: int, dialect: str, extra: str = "") -> int:
    """Instructions valgrind counted for one driver process of ``count`` requests."""
    with tempfile.NamedTemporaryFile(suffix=".log") as log:
        command = [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
            f"--log-file={log.name}",
            sys.executable,
            "-m",
            "bench.edge_instructions",
            "--drive",
            str(port),
            str(count),
            dialect,
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0", EXTRA_ENV: extra}
        subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        found = re.search(r"I\s+refs:\s+([\d,]+)", Path(log.name).read_text())
    if found is None:
        raise RuntimeError("valgrind printed no instruction count")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dialect", default="chat", choices=["chat", "messages", "responses"])
    parser.add_argument("--few", type=int, default=50)
    parser.add_argument("--many", type=int, default=450)
    parser.add_argument("--drive", nargs=3, metavar=("PORT", "COUNT", "DIALECT"))
    parser.add_argument(
        "--config-extra",
        default="",
        help="YAML appended to the config, e.g. 'observability: {metrics: {enabled: false}}'",
    )
    args = parser.parse_args()
    if args.drive:
        drive(int(args.drive[0]), int(args.drive[1]), args.drive[2])
        return
    from tests.fixtures.server import free_port

    port = free_port()
    upstream = subprocess.Popen([sys.executable, "-m", "bench.fake_upstream", str(port)], cwd=ROOT)
    try:
        time.sleep(0.5)
        few = instructions(port, args.few, args.dialect, args.config_extra)
        many = instructions(port, args.many, args.dialect, args.config_extra)
    finally:
        upstream.terminate()
        upstream.wait(10)
    per = (many - few) / (args.many - args.few)
    print(f"{args.dialect:9s} {per / 1e6:.3f} M instructions/request ({args.few} vs {args.many})")


if __name__ == "__main__":
    main()
