"""CPU per request of the gateway application alone (no HTTP server in front of it).

A steadier figure than ``bench.gateway`` for A/B comparisons of the edge: the app is driven
in-process through ``httpx.ASGITransport`` (so uvicorn's protocol and the socket work are
not in the figure), sequentially, against the fast fake upstream (bench/fake_upstream.py,
pinned to core 1, the driver to core 0). Each round sends ``--requests`` requests and takes
this process's CPU time; the minimum over ``--rounds`` rounds is printed per dialect (the
minimum is the least disturbed by whatever else the machine does).

Run from the tree to measure (the app is imported from the current directory):
    taskset -c 0 .venv/bin/python -m bench.edge_cpu [--rounds 7] [--requests 400]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.gateway import DIALECTS
from core.config import parse_config
from gateway.app import create_app
from tests.fixtures.server import free_port

ROOT = Path(__file__).resolve().parent.parent


async def rounds(
    port: int, dialects: list[str], count: int, repeat: int, extra: str = ""
) -> dict[str, float]:
    """Best CPU ms per request per dialect; ``extra``: YAML sections added to the config
    (e.g. ``observability: {metrics: {enabled: false}}`` for an A/B)."""
    config = parse_config(
        "logging: {level: info, json: true}\nproviders:\n"
        f"  up: {{type: openai, base_url: 'http://127.0.0.1:{port}/v1', api_key_env: K}}\n"
        "models:\n  bench: {targets: [{provider: up, model: bench-model}]}\n" + extra
    )
    app = create_app(config, env={"K": "sk-bench"})
    best: dict[str, float] = {}
    async with app.lifespan():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            for name in dialects:
                path, body = DIALECTS[name]
                headers = {"content-type": "application/json"}
                for _ in range(20):  # warm-up
                    (await client.post(path, content=body, headers=headers)).raise_for_status()
                for _ in range(repeat):
                    start = time.process_time()
                    for _ in range(count):
                        answer = await client.post(path, content=body, headers=headers)
                        answer.raise_for_status()
                    per = (time.process_time() - start) / count * 1000
                    best[name] = min(best.get(name, per), per)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--dialects", default="chat,messages,responses")
    parser.add_argument("--config-extra", default="", help="YAML appended to the config")
    args = parser.parse_args()
    port = free_port()
    upstream = subprocess.Popen(
        ["taskset", "-c", "1", sys.executable, "-m", "bench.fake_upstream", str(port)],
        cwd=ROOT,
    )
    try:
        time.sleep(0.5)
        names = args.dialects.split(",")
        best = asyncio.run(rounds(port, names, args.requests, args.rounds, args.config_extra))
    finally:
        upstream.terminate()
        upstream.wait(10)
    for name in names:
        print(
            f"{name:9s} app CPU {best[name]:.3f} ms/request (min of {args.rounds} x {args.requests})"
        )
    print(f"pid {os.getpid()}")


if __name__ == "__main__":
    main()
