"""Cold start and compiles under load of ``switchyard worker jax`` (default settings).

    .venv/bin/python bench/cold_start.py [--load-s 30] [--streams 8] [--repo DIR] [--skip-warm]

1. Starts the worker as a subprocess with an EMPTY compile cache (a temp dir passed with
   ``--compile-cache-dir``) and times process start -> ``/health`` 200.
2. Stops it and starts it again on the now filled cache (the warm start), timing the same.
3. With that worker up, runs a bounded load: ``--streams`` concurrent streaming completions
   for ``--load-s`` seconds, a mix of prompt lengths (short, medium, long) half of which start
   with one shared ~300-token prefix; counts the ``compiled step`` lines the worker logged
   during the load (a shape compiled on the serving path, stalling every stream) and prints
   TTFT p50/p90 and the completion count.

``--repo`` runs another checkout's worker (e.g. an exported older commit, for a before/after
comparison) with this interpreter. The worker's log goes to ``--log`` (default a temp file).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
WORDS: tuple[str, ...] = ("river", "stone", "cloud", "market", "engine", "lantern", "orchard")
WORDS += ("copper", "signal", "harbor", "meadow", "window", "ladder", "garden", "thunder")


def start_worker(repo: Path, port: int, cache: Path, log: Path) -> subprocess.Popen[bytes]:
    """``python -m local_tier.worker`` from ``repo`` with default settings and ``cache``."""
    cmd = [sys.executable, "-m", "local_tier.worker", "--port", str(port)]
    cmd += ["--compile-cache-dir", str(cache)]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    with log.open("ab") as out:
        return subprocess.Popen(cmd, cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_ready(proc: subprocess.Popen[bytes], port: int, limit_s: float) -> float:
    """Seconds from now until ``/health`` answers 200; raises if the process dies or times
    out."""
    t0 = time.monotonic()
    url = f"http://127.0.0.1:{port}/health"
    while time.monotonic() - t0 < limit_s:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"worker not ready within {limit_s:.0f}s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def prompt(rng: random.Random, shared: str) -> str:
    """Short (~20 words), medium (~120) or long (~400) text; half start with ``shared``."""
    n = rng.choice((20, 120, 400))
    body = " ".join(rng.choice(WORDS) for _ in range(n))
    return (shared + " " + body) if rng.random() < 0.5 else body


async def one_stream(
    client: httpx.AsyncClient, port: int, text: str, max_tokens: int
) -> float | None:
    """TTFT of one streaming completion (None if no token came back)."""
    body = {
        "model": "smollm2-135m-instruct",
        "prompt": text,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    t0 = time.monotonic()
    first = None
    url = f"http://127.0.0.1:{port}/v1/completions"
    async with client.stream("POST", url, json=body, timeout=120) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if first is None and line.startswith("data: {"):
                first = time.monotonic() - t0
    return first


async def load(port: int, streams: int, seconds: float, seed: int) -> list[float]:
    """``streams`` closed-loop clients for ``seconds``; returns every request's TTFT."""
    rng = random.Random(seed)
    shared = " ".join(rng.choice(WORDS) for _ in range(250))
    ttfts: list[float] = []
    deadline = time.monotonic() + seconds

    async def client_loop(k: int) -> None:
        r = random.Random(seed * 1000 + k)
        async with httpx.AsyncClient() as client:
            while time.monotonic() < deadline:
                t = await one_stream(client, port, prompt(r, shared), r.choice((16, 64, 128)))
                if t is not None:
                    ttfts.append(t)

    await asyncio.gather(*(client_loop(k) for k in range(streams)))
    return ttfts


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", type=Path, default=ROOT)
    ap.add_argument("--port", type=int, default=8391)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--load-s", type=float, default=30.0)
    ap.add_argument("--limit-s", type=float, default=600.0, help="give up on start after this")
    ap.add_argument("--skip-warm", action="store_true", help="cold start only, no load")
    ap.add_argument("--log", type=Path, default=None)
    args = ap.parse_args()
    log = args.log or Path(tempfile.mkstemp(prefix="cold_start_", suffix=".log")[1])
    print(f"worker log: {log}", flush=True)
    with tempfile.TemporaryDirectory(prefix="jax_cache_") as tmp:
        cache = Path(tmp)
        proc = start_worker(args.repo, args.port, cache, log)
        try:
            print(f"cold start (empty cache): {wait_ready(proc, args.port, args.limit_s):.1f}s")
        finally:
            stop(proc)
        if args.skip_warm:
            return
        proc = start_worker(args.repo, args.port, cache, log)
        try:
            print(f"warm start (filled cache): {wait_ready(proc, args.port, args.limit_s):.1f}s")
            before = log.read_text(errors="replace").count("compiled step")
            ttfts = asyncio.run(load(args.port, args.streams, args.load_s, seed=7))
            during = log.read_text(errors="replace").count("compiled step") - before
        finally:
            stop(proc)
    print(
        f"load: {args.streams} streams x {args.load_s:.0f}s, {len(ttfts)} completions, "
        f"TTFT p50 {pct(ttfts, 50):.2f}s p90 {pct(ttfts, 90):.2f}s; "
        f"'compiled step' lines during load: {during}"
    )


if __name__ == "__main__":
    main()
