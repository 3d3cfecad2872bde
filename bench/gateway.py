"""Gateway overhead benchmark (issue: gateway core). Not a test: it prints figures.

One run: a fake upstream that answers at once (bench/fake_upstream.py, pinned to core 1), the
gateway pinned to core 0 (`taskset`), and the same load sent straight to the upstream as the
floor. For each server (uvicorn, granian) it reports
  - max requests/s on one core and gateway CPU ms per request (wrk, 64 connections, closed loop;
    CPU from the process's own utime+stime over the run),
  - added p50/p99 latency at a fixed rate (open loop, Poisson arrivals),
  - added time to first byte for streams,
  - the gateway's RSS after the load.

Run: .venv/bin/python -m bench.gateway [--seconds 8] [--rate 300] [--servers uvicorn,granian]
     .venv/bin/python -m bench.gateway --metrics-ab 5   (CPU per request, metrics off vs on)
Needs `wrk` (Debian package) and taskset; loopback only; stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from bench.rawclient import Connection, post_request
from tests.fixtures.server import free_port

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
BODY = json.dumps(
    {
        "model": "bench",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Say hello in a friendly way, please."},
        ],
        "temperature": 0.2,
        "max_tokens": 64,
    }
).encode()
STREAM_BODY = BODY[:-1] + b',"stream":true}'
# The same conversation in each client dialect: (path, body), for --dialects.
DIALECTS: dict[str, tuple[str, bytes]] = {
    "chat": ("/v1/chat/completions", BODY),
    "messages": (
        "/v1/messages",
        json.dumps(
            {
                "model": "bench",
                "system": "You are a helpful assistant.",
                "messages": [{"role": "user", "content": "Say hello in a friendly way, please."}],
                "temperature": 0.2,
                "max_tokens": 64,
            }
        ).encode(),
    ),
    "responses": (
        "/v1/responses",
        json.dumps(
            {
                "model": "bench",
                "instructions": "You are a helpful assistant.",
                "input": "Say hello in a friendly way, please.",
                "temperature": 0.2,
                "max_output_tokens": 64,
            }
        ).encode(),
    ),
}


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def start_upstream(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["taskset", "-c", "1", PY, "-m", "bench.fake_upstream", str(port)], cwd=ROOT
    )


def start_gateway(server: str, config: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SWITCHYARD_CONFIG": str(config)}
    if server == "uvicorn":
        cmd = [PY, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port)]
    else:
        cmd = [
            str(Path(PY).parent / "granian"),
            "--interface",
            "asgi",
            "--factory",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--loop",
            "uvloop",
            "--log-level",
            "warning",
            "gateway.asgi:app_from_env",
        ]
    return subprocess.Popen(
        ["taskset", "-c", "0", *cmd],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def gateway_process(proc: subprocess.Popen[bytes]) -> psutil.Process:
    """The process doing the work: the launched one, or granian's single worker."""
    parent = psutil.Process(proc.pid)
    children = parent.children(recursive=True)
    return children[-1] if children else parent


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def run_wrk(port: int, path: str, seconds: int, body: bytes = BODY) -> tuple[float, int]:
    """(requests/s, completed requests) for a closed-loop POST load with 64 connections."""
    script = Path(tempfile.mkstemp(suffix=".lua")[1])
    script.write_text(
        "wrk.method='POST'\nwrk.headers['Content-Type']='application/json'\n"
        f"wrk.body=[[{body.decode()}]]\n"
    )
    out = subprocess.run(
        [
            "taskset",
            "-c",
            "1",
            "wrk",
            "-t1",
            "-c64",
            f"-d{seconds}s",
            "-s",
            str(script),
            f"http://127.0.0.1:{port}{path}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    script.unlink()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    done = int(re.search(r"(\d+) requests in", out).group(1))
    if "Non-2xx" in out:
        raise RuntimeError("wrk saw errors:\n" + out)
    return rps, done


async def fixed_rate(
    port: int, path: str, body: bytes, rate: float, seconds: float
) -> list[tuple[float, float]]:
    """Open-loop Poisson arrivals; returns (first byte, total) seconds for each request."""
    raw = post_request(path, body)
    idle: list[Connection] = [await Connection.open(port) for _ in range(8)]
    results: list[tuple[float, float]] = []
    rng = random.Random(7)

    async def one() -> None:
        conn = idle.pop() if idle else await Connection.open(port)
        status, first, total = await conn.request(raw)
        if status != 200:
            raise RuntimeError(f"status {status}")
        results.append((first, total))
        idle.append(conn)

    tasks, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)
    for conn in idle:
        conn.close()
    return results


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000 if len(values) > 2 else float("nan")


def write_config(workdir: Path, up_port: int, extra: str = "") -> Path:
    """The gateway's config for one run; ``extra``: YAML sections appended."""
    config = workdir / "bench.yaml"
    config.write_text(
        "logging: {level: info, json: true}\nproviders:\n"
        f"  up: {{type: openai, base_url: 'http://127.0.0.1:{up_port}/v1', api_key_env: BENCH_KEY}}\n"
        "models:\n  bench: {targets: [{provider: up, model: bench-model}]}\n" + extra
    )
    os.environ["BENCH_KEY"] = "sk-bench"
    return config


METRICS_OFF = "observability: {metrics: {enabled: false}}\n"


def wrk_cpu_ms(
    worker: psutil.Process,
    port: int,
    seconds: int,
    path: str = "/v1/chat/completions",
    body: bytes = BODY,
) -> tuple[float, float]:
    """wrk for ``seconds`` after a short warm-up: (requests/s, gateway CPU ms per request)."""
    run_wrk(port, path, 2, body)  # warm-up
    cpu0 = cpu_seconds(worker)
    rps, done = run_wrk(port, path, seconds, body)
    return rps, (cpu_seconds(worker) - cpu0) / done * 1000


def metrics_ab(up_port: int, args: argparse.Namespace, workdir: Path) -> None:
    """Gateway CPU per plain request with metrics off and on (uvicorn, wrk, one core),
    alternating ``--metrics-ab`` times; prints the minimum of each (the least disturbed)."""
    best: dict[str, float] = {}
    for _ in range(args.metrics_ab):
        for name, extra in (("off", METRICS_OFF), ("on", "")):
            config = write_config(workdir, up_port, extra + args.config_extra)
            port = free_port()
            proc = start_gateway("uvicorn", config, port, workdir / f"ab-{name}.log")
            try:
                wait_http(f"http://127.0.0.1:{port}/healthz")
                _, per = wrk_cpu_ms(gateway_process(proc), port, args.seconds)
            finally:
                proc.terminate()
                proc.wait(10)
            best[name] = min(best.get(name, per), per)
            print(f"metrics {name:3s}: gateway CPU {per:.4f} ms/req")
    added = best["on"] - best["off"]
    print(
        f"metrics A/B (min of {args.metrics_ab}): off {best['off']:.4f} ms/req, "
        f"on {best['on']:.4f} ms/req, added {added:+.4f} ms/req"
    )


def measure(server: str, up_port: int, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    config = write_config(workdir, up_port, args.config_extra)
    port = free_port()
    proc = start_gateway(server, config, port, workdir / f"{server}.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        worker = gateway_process(proc)
        rps, cpu_ms = wrk_cpu_ms(worker, port, args.seconds)
        plain = asyncio.run(fixed_rate(port, "/v1/chat/completions", BODY, args.rate, args.seconds))
        streams = asyncio.run(
            fixed_rate(port, "/v1/chat/completions", STREAM_BODY, args.rate / 3, args.seconds / 2)
        )
        rss = worker.memory_info().rss / 2**20
        per_dialect = {}
        for name in args.dialects.split(","):
            path, body = DIALECTS[name]
            dialect_rps, per_dialect[name] = wrk_cpu_ms(worker, port, args.seconds, path, body)
            per_dialect[name + "_rps"] = dialect_rps
    finally:
        proc.terminate()
        proc.wait(10)
    return {
        "rps": rps,
        "cpu_ms": cpu_ms,
        "p50": pct([t for _, t in plain], 50),
        "p99": pct([t for _, t in plain], 99),
        "ttft50": pct([f for f, _ in streams], 50),
        "ttft99": pct([f for f, _ in streams], 99),
        "rss": rss,
        **per_dialect,
    }


def floor(up_port: int, args: argparse.Namespace) -> dict[str, float]:
    rps, _ = run_wrk(up_port, "/v1/chat/completions", max(2, args.seconds // 2))
    plain = asyncio.run(fixed_rate(up_port, "/v1/chat/completions", BODY, args.rate, args.seconds))
    streams = asyncio.run(
        fixed_rate(up_port, "/v1/chat/completions", STREAM_BODY, args.rate / 3, args.seconds / 2)
    )
    return {
        "rps": rps,
        "p50": pct([t for _, t in plain], 50),
        "p99": pct([t for _, t in plain], 99),
        "ttft50": pct([f for f, _ in streams], 50),
        "ttft99": pct([f for f, _ in streams], 99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rate", type=float, default=300.0)
    parser.add_argument("--servers", default="uvicorn,granian")
    parser.add_argument(
        "--dialects",
        default="chat",
        help="also CPU per request per client dialect: chat,messages,responses",
    )
    parser.add_argument("--config-extra", default="", help="YAML appended to the config")
    parser.add_argument(
        "--metrics-ab",
        type=int,
        default=0,
        metavar="N",
        help="only compare gateway CPU per request with metrics off and on, N rounds each",
    )
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("bench needs wrk: apt-get install wrk")
    up_port = free_port()
    upstream = start_upstream(up_port)
    try:
        time.sleep(0.5)
        if args.metrics_ab:
            with tempfile.TemporaryDirectory() as tmp:
                metrics_ab(up_port, args, Path(tmp))
            return
        direct = floor(up_port, args)
        print(
            f"direct to upstream: {direct['rps']:.0f} req/s; p50 {direct['p50']:.2f} ms, "
            f"p99 {direct['p99']:.2f} ms; stream TTFB p50 {direct['ttft50']:.2f} ms"
        )
        with tempfile.TemporaryDirectory() as tmp:
            for server in args.servers.split(","):
                r = measure(server, up_port, args, Path(tmp))
                print(
                    f"{server:8s} one core: {r['rps']:.0f} req/s, gateway CPU {r['cpu_ms']:.3f} ms/req, "
                    f"added latency at {args.rate:.0f} req/s p50 {r['p50'] - direct['p50']:.2f} ms "
                    f"p99 {r['p99'] - direct['p99']:.2f} ms, added stream TTFB p50 "
                    f"{r['ttft50'] - direct['ttft50']:.2f} ms p99 {r['ttft99'] - direct['ttft99']:.2f} ms, "
                    f"RSS {r['rss']:.0f} MiB"
                )
                for name in args.dialects.split(","):
                    print(
                        f"{server:8s} {name:9s} gateway CPU {r[name]:.3f} ms/req, "
                        f"{r[name + '_rps']:.0f} req/s on one core"
                    )
    finally:
        upstream.terminate()
        upstream.wait(10)


if __name__ == "__main__":
    main()
