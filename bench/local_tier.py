"""Local-tier benchmark: the same load against one or more OpenAI-compatible workers.

Run from the repository root (as a module: a plain ``python bench/local_tier.py`` would shadow
the ``local_tier`` package with this file)::

    .venv/bin/python -m bench.local_tier --vllm              # starts vLLM (scripts/setup_vllm.sh)
    .venv/bin/python -m bench.local_tier --vllm --jax        # both, one after the other + ratios
    .venv/bin/python -m bench.local_tier --target mine=http://127.0.0.1:8000@4242
                                                   # an already running server (@PID: RSS too)

Options: ``--quick`` (fewer repetitions, for a smoke run), ``--json PATH`` (raw figures),
``--phases c8,c32`` (only those measurements),
``--max-seconds`` (per target, default 900). Each phase gets a share of it (``SHARES``); a phase
cut off keeps what it measured (the concurrency phases count the tokens streamed so far, and
``completed_at_N`` says how many of the 2N requests finished), so a run stops by itself.
Servers it starts run one at a time on 127.0.0.1 and are stopped at the end; URLs other than
loopback are refused. The worker needs ``/tokenize`` with chat ``messages`` (vLLM's API).

What it measures, per target (temperature 0, ``ignore_eos`` so outputs have the asked length):

- TTFT of a 100-token and a 500-token prompt: medians of 5 streamed requests, each prompt new
  (a random session number, then random words) so no prefix-cache hit flatters them. Prompt lengths are exact, counted by the
  server's own ``/tokenize`` with the chat template applied.
- Decode tok/s of one stream: (output tokens - 1) / (last token - first token), median of 3.
- Total output tok/s at 8 and at 32 concurrent streams: 2N requests arriving as a Poisson
  process (rate N/s), at most N in flight; output tokens / (last end - first start), plus
  TTFT p50/p95 under that load.
- Shared 500-token prefix: TTFT of a new prompt, of the same prompt again, and of the same
  prefix with a different question; ``cached_tokens`` from usage where reported.
- Host load (1-minute load average) before and after each target: the vLLM CPU build pins its
  engine to one core, so neighbours' load skews the comparison; trust figures from an idle host.
- Peak RSS of the server's process tree (psutil, every 0.25 s; shared pages count once per
  process, so the sum overstates a forked server a little).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import psutil

from bench.local_tier_client import Prompts, StreamResult, Target, stream_chat
from local_tier.vllm.process import VllmProcess, VllmSettings, WorkerProcess, free_port


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _p95(values: list[float]) -> float | None:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)] if values else None


LOOPBACK = {"127.0.0.1", "localhost", "::1"}


async def measure_ttft(client: httpx.AsyncClient, t: Target, p: Prompts, reps: int) -> None:
    for n in (100, 500):
        ttfts: list[float | None] = []
        for _ in range(reps):
            ttfts.append((await stream_chat(client, t, await p.build(n), 1)).ttft)
            t.figures[f"ttft_{n}_s"] = _median(ttfts)  # so far: a cut-off run keeps it


async def measure_decode(client: httpx.AsyncClient, t: Target, p: Prompts, reps: int) -> None:
    rates: list[float | None] = []
    for _ in range(reps):
        r = await stream_chat(client, t, await p.build(100), 128)
        rates.append((r.output_tokens - 1) / r.decode_time if r.decode_time > 0 else None)
        t.figures["decode_1_tok_s"] = _median(rates)


async def measure_concurrent(
    client: httpx.AsyncClient, t: Target, p: Prompts, n: int, budget: float
) -> None:
    """2n requests, Poisson arrivals at n/s, at most n in flight, cut off after ``budget`` s
    (what streamed until then still counts)."""
    prompts = [await p.build(100) for _ in range(2 * n)]
    gate, rng, results = asyncio.Semaphore(n), random.Random(n), list[StreamResult]()
    cutoff = time.monotonic() + budget

    async def one(messages: list[dict[str, str]]) -> None:
        async with gate:
            results.append(res := StreamResult())
            await stream_chat(client, t, messages, 128, res)

    tasks: list[asyncio.Task[None]] = []
    try:
        for messages in prompts:
            tasks.append(asyncio.create_task(one(messages)))
            await asyncio.sleep(rng.expovariate(n))
        await asyncio.wait(tasks, timeout=max(0.0, cutoff - time.monotonic()))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    _concurrency_figures(t, n, results)


def _concurrency_figures(t: Target, n: int, results: list[StreamResult]) -> None:
    if not results:
        return
    now = time.perf_counter()
    span = max(r.ended or now for r in results) - min(r.started for r in results)
    ttfts = [r.ttft for r in results if r.ttft is not None]
    t.figures[f"total_{n}_tok_s"] = sum(r.output_tokens for r in results) / span
    t.figures[f"ttft_p50_at_{n}_s"] = _median(list(ttfts))
    t.figures[f"ttft_p95_at_{n}_s"] = _p95(ttfts)
    t.figures[f"completed_at_{n}"] = float(sum(1 for r in results if r.ended))


async def measure_prefix(client: httpx.AsyncClient, t: Target, p: Prompts, reps: int) -> None:
    """Per round: a new 500-token prompt, the same again, then its 500 tokens plus a new tail."""
    series: dict[str, list[float | None]] = {
        "prefix_first_ttft_s": [],
        "prefix_repeat_ttft_s": [],
        "prefix_new_tail_ttft_s": [],
        "prefix_repeat_cached_tokens": [],
    }
    for _ in range(reps):
        prompt = await p.build(500)
        tail = await p.build(520, base=prompt)
        a = await stream_chat(client, t, prompt, 1)
        b = await stream_chat(client, t, prompt, 1)
        c = await stream_chat(client, t, tail, 1)
        cached = None if b.cached_tokens is None else float(b.cached_tokens)
        for key, value in zip(series, (a.ttft, b.ttft, c.ttft, cached), strict=True):
            series[key].append(value)
            t.figures[key] = _median(series[key])


async def sample_rss(pid: int, peak: list[int], stop: asyncio.Event) -> None:
    """Keep ``peak[0]`` at the largest RSS sum of ``pid`` and its descendants seen so far."""
    root = psutil.Process(pid)
    while not stop.is_set():
        with contextlib.suppress(psutil.Error):
            procs = [root, *root.children(recursive=True)]
            total = 0
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    total += proc.memory_info().rss
            peak[0] = max(peak[0], total)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


# Share of --max-seconds each phase may use; a phase cut off keeps what it measured.
SHARES = {"ttft": 0.2, "decode": 0.15, "c8": 0.2, "c32": 0.25, "prefix": 0.2}


async def run_target(
    t: Target, quick: bool, max_seconds: float, only: frozenset[str] = frozenset(SHARES)
) -> None:
    """The measurements named in ``only`` (default all) for one target, each phase within its
    share of ``max_seconds``."""
    peak, stop = [0], asyncio.Event()
    limits = httpx.Limits(max_connections=64)
    t.figures["host_load_1m_before"] = os.getloadavg()[0]  # other work on the same cores
    async with httpx.AsyncClient(timeout=300.0, limits=limits, trust_env=False) as client:
        models = (await client.get(f"{t.base_url}/v1/models")).json()["data"]
        t.model = models[0]["id"]
        sampler = asyncio.create_task(sample_rss(t.pid, peak, stop)) if t.pid else None
        p = Prompts(client, t)
        await stream_chat(client, t, await p.build(50), 8)  # warm-up, not counted
        reps = 2 if quick else 5
        budget = {k: v * max_seconds for k, v in SHARES.items()}
        phases = {
            "ttft": measure_ttft(client, t, p, reps),
            "decode": measure_decode(client, t, p, 1 if quick else 3),
            "c8": measure_concurrent(client, t, p, 8, budget["c8"]),
            "c32": measure_concurrent(client, t, p, 32, budget["c32"]),
            "prefix": measure_prefix(client, t, p, 1 if quick else 3),
        }
        for name in set(phases) - only:
            phases.pop(name).close()
        try:
            for name, phase in phases.items():
                try:
                    await asyncio.wait_for(phase, budget[name] + 30)  # c8/c32 stop themselves
                except TimeoutError:
                    print(f"[{t.name}] phase {name} cut off at its budget", file=sys.stderr)
        finally:
            for phase in phases.values():
                phase.close()  # those never awaited, if one phase raised
            stop.set()
            if sampler:
                await sampler
    t.figures["peak_rss_mib"] = peak[0] / 2**20 if peak[0] else None
    t.figures["host_load_1m_after"] = os.getloadavg()[0]


@contextlib.contextmanager
def started(kind: str, log_dir: Path) -> Iterator[WorkerProcess]:
    """Start a vLLM or JAX worker on a free loopback port; stop its process group after."""
    port = free_port()
    log = log_dir / f"{kind}.log"
    worker: WorkerProcess
    if kind == "vllm":
        worker = VllmProcess(VllmSettings(port=port), log_path=log)
    else:
        argv = [sys.executable, "-m", "local_tier.worker", "--port", str(port)]
        worker = WorkerProcess(argv, port=port, log_path=log)
    t0 = time.monotonic()
    worker.start()
    try:
        worker.wait_healthy(timeout=600)
        print(f"[{kind}] healthy after {time.monotonic() - t0:.1f} s (log {log})", file=sys.stderr)
        yield worker
    finally:
        worker.stop()


def render(targets: list[Target]) -> str:
    """A markdown table: one row per figure, one column per target, jax/vllm when both ran."""
    names = [t.name for t in targets]
    ratio = "jax" in names and "vllm" in names
    head = ["figure", *names, *(["jax/vllm"] if ratio else [])]
    keys = list(dict.fromkeys(k for t in targets for k in t.figures))
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    by = {t.name: t.figures for t in targets}
    for key in keys:
        vals = [by[n].get(key) for n in names]
        cells = [key, *("-" if v is None else f"{v:.3f}" for v in vals)]
        if ratio:
            j, v = by["jax"].get(key), by["vllm"].get(key)
            cells.append(f"{j / v:.2f}" if j is not None and v else "-")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def parse_target(spec: str) -> Target:
    """``name=http://127.0.0.1:PORT[@PID]``; only loopback hosts."""
    name, _, rest = spec.partition("=")
    url, _, pid = rest.partition("@")
    if urlparse(url).hostname not in LOOPBACK:
        raise SystemExit(f"refusing non-loopback target {url!r}")
    return Target(name, url.rstrip("/").removesuffix("/v1"), int(pid) if pid else None)


async def _bench(targets: list[Target], args: argparse.Namespace) -> None:
    for t in targets:
        await run_target(t, args.quick, args.max_seconds, args.phases)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm", action="store_true", help="start a vLLM worker and bench it")
    ap.add_argument("--jax", action="store_true", help="start the JAX worker and bench it")
    ap.add_argument("--target", action="append", default=[], help="name=URL[@PID], repeatable")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--max-seconds", type=float, default=900.0, help="per target")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument(
        "--phases",
        default=",".join(SHARES),
        help=f"comma list of {','.join(SHARES)}",
        type=lambda s: frozenset(s.split(",")),
    )
    args = ap.parse_args(argv)
    targets = [parse_target(s) for s in args.target]
    kinds = [k for k in ("vllm", "jax") if getattr(args, k)]
    if not targets and not kinds:
        ap.error("give --vllm, --jax or --target")
    done: list[Target] = []
    with tempfile.TemporaryDirectory(prefix="bench-local-tier-") as tmp:
        for t in targets:
            asyncio.run(_bench([t], args))
            done.append(t)
        for kind in kinds:  # one at a time: they would share the same cores
            with started(kind, Path(tmp)) as worker:
                t = Target(kind, worker.base_url, worker.pid)
                asyncio.run(_bench([t], args))
                done.append(t)
    print(render(done))
    if args.json:
        args.json.write_text(json.dumps({t.name: t.figures for t in done}, indent=2))


if __name__ == "__main__":
    main()
