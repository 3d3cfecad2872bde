"""Local-tier benchmark: the same load against one or more OpenAI-compatible workers.

Run from the repository root (as a module: a plain ``python bench/local_tier.py`` would shadow
the ``local_tier`` package with this file)::

    .venv/bin/python -m bench.local_tier --vllm              # starts vLLM (scripts/setup_vllm.sh)
    .venv/bin/python -m bench.local_tier --vllm --jax        # both, one after the other + ratios
    .venv/bin/python -m bench.local_tier --target mine=http://127.0.0.1:8000@4242
                                                   # an already running server (@PID: RSS too)

Options: ``--quick`` (fewer repetitions, for a smoke run), ``--json PATH`` (raw figures),
``--max-seconds`` (per target; the run stops by itself then and reports what it measured).
Servers it starts run one at a time on 127.0.0.1 and are stopped at the end; URLs other than
loopback are refused. The worker needs ``/tokenize`` with chat ``messages`` (vLLM's API).

What it measures, per target (temperature 0, ``ignore_eos`` so outputs have the asked length):

- TTFT of a 100-token and a 500-token prompt: medians of 5 streamed requests, each prompt new
  (random words) so no prefix-cache hit flatters them. Prompt lengths are exact, counted by the
  server's own ``/tokenize`` with the chat template applied.
- Decode tok/s of one stream: (output tokens - 1) / (last token - first token), median of 3.
- Total output tok/s at 8 and at 32 concurrent streams: 2N requests arriving as a Poisson
  process (rate N/s), at most N in flight; output tokens / (last end - first start), plus
  TTFT p50/p95 under that load.
- Shared 500-token prefix: TTFT of a new prompt, of the same prompt again, and of the same
  prefix with a different question; ``cached_tokens`` from usage where reported.
- Peak RSS of the server's process tree (psutil, every 0.25 s; shared pages count once per
  process, so the sum overstates a forked server a little).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import httpx
import psutil
from httpx_sse import aconnect_sse

from local_tier.vllm.process import VllmProcess, VllmSettings, WorkerProcess, free_port

# Short, common words: each is one BPE token after a space, so prompt length moves one token
# per word while the builder converges on the exact count.
WORDS = (
    "the",
    "cat",
    "dog",
    "sun",
    "red",
    "blue",
    "tree",
    "house",
    "water",
    "city",
    "road",
    "book",
    "time",
    "day",
    "night",
    "light",
    "green",
    "small",
    "big",
    "old",
    "new",
    "good",
    "man",
    "car",
)
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass
class StreamResult:
    """One streamed chat completion, timed on the client."""

    ttft: float | None = None
    decode_time: float = 0.0  # first content chunk -> last content chunk
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    started: float = 0.0
    ended: float = 0.0


@dataclass
class Target:
    name: str
    base_url: str
    pid: int | None = None
    model: str = ""
    figures: dict[str, float | None] = field(default_factory=dict)


async def stream_chat(
    client: httpx.AsyncClient, target: Target, messages: list[dict[str, str]], max_tokens: int
) -> StreamResult:
    """POST a streaming chat completion and time its chunks."""
    body = {
        "model": target.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    res = StreamResult(started=time.perf_counter())
    first = last = 0.0
    url = f"{target.base_url}/v1/chat/completions"
    async with aconnect_sse(client, "POST", url, json=body) as events:
        if events.response.status_code != 200:
            await events.response.aread()
            raise RuntimeError(f"{url}: {events.response.status_code} {events.response.text}")
        async for sse in events.aiter_sse():
            if sse.data == "[DONE]":
                break
            chunk = json.loads(sse.data)
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices") or []):
                last = time.perf_counter()
                first = first or last
                res.output_tokens += 1  # replaced by usage when the server reports it
            if usage := chunk.get("usage"):
                res.output_tokens = usage.get("completion_tokens", res.output_tokens)
                res.prompt_tokens = usage.get("prompt_tokens")
                details = usage.get("prompt_tokens_details") or {}
                res.cached_tokens = details.get("cached_tokens")
    res.ended = time.perf_counter()
    res.ttft = first - res.started if first else None
    res.decode_time = last - first
    return res


class Prompts:
    """Chat prompts of exact token counts, as the target's ``/tokenize`` counts them."""

    def __init__(self, client: httpx.AsyncClient, target: Target, seed: int = 7) -> None:
        self.client, self.target, self.rng = client, target, random.Random(seed)

    async def count(self, messages: list[dict[str, str]]) -> int:
        body = {"model": self.target.model, "messages": messages, "add_generation_prompt": True}
        resp = await self.client.post(f"{self.target.base_url}/tokenize", json=body)
        resp.raise_for_status()
        return int(resp.json()["count"])

    def words(self, n: int) -> list[str]:
        return [self.rng.choice(WORDS) for _ in range(n)]

    async def build(self, n_tokens: int, head: list[str] | None = None) -> list[dict[str, str]]:
        """A user message of ``n_tokens`` prompt tokens in all, starting with ``head`` words."""
        fixed, words = head or [], list[str]()
        for _ in range(8):
            messages = [{"role": "user", "content": " ".join(fixed + words)}]
            missing = n_tokens - await self.count(messages)
            if missing == 0:
                return messages
            words = words + self.words(missing) if missing > 0 else words[:missing]
        raise RuntimeError(f"could not build a prompt of exactly {n_tokens} tokens")


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _p95(values: list[float]) -> float | None:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)] if values else None


async def measure_ttft(client: httpx.AsyncClient, t: Target, p: Prompts, reps: int) -> None:
    for n in (100, 500):
        runs = [await stream_chat(client, t, await p.build(n), 1) for _ in range(reps)]
        t.figures[f"ttft_{n}_s"] = _median([r.ttft for r in runs])


async def measure_decode(client: httpx.AsyncClient, t: Target, p: Prompts, reps: int) -> None:
    rates: list[float | None] = []
    for _ in range(reps):
        r = await stream_chat(client, t, await p.build(100), 128)
        rates.append((r.output_tokens - 1) / r.decode_time if r.decode_time > 0 else None)
    t.figures["decode_1_tok_s"] = _median(rates)


async def measure_concurrent(
    client: httpx.AsyncClient, t: Target, p: Prompts, n: int, deadline: float
) -> None:
    """2n requests, Poisson arrivals at n/s, at most n in flight, cut off at ``deadline``."""
    prompts = [await p.build(100) for _ in range(2 * n)]
    gate, rng, results = asyncio.Semaphore(n), random.Random(n), []

    async def one(messages: list[dict[str, str]]) -> None:
        async with gate:
            results.append(await stream_chat(client, t, messages, 128))

    tasks = []
    for messages in prompts:
        tasks.append(asyncio.create_task(one(messages)))
        await asyncio.sleep(rng.expovariate(n))
    with contextlib.suppress(TimeoutError):  # report what finished by the deadline
        await asyncio.wait_for(asyncio.gather(*tasks), max(1.0, deadline - time.monotonic()))
    if not results:
        return
    span = max(r.ended for r in results) - min(r.started for r in results)
    ttfts = [r.ttft for r in results if r.ttft is not None]
    t.figures[f"total_{n}_tok_s"] = sum(r.output_tokens for r in results) / span
    t.figures[f"ttft_p50_at_{n}_s"] = _median(list(ttfts))
    t.figures[f"ttft_p95_at_{n}_s"] = _p95(ttfts)
    t.figures[f"completed_at_{n}"] = float(len(results))


async def measure_prefix(client: httpx.AsyncClient, t: Target, p: Prompts, reps: int) -> None:
    first, repeat, other, cached = [], [], [], []
    for _ in range(reps):
        prompt = await p.build(500)
        head = prompt[0]["content"].split()
        a = await stream_chat(client, t, prompt, 1)
        b = await stream_chat(client, t, prompt, 1)
        c = await stream_chat(client, t, await p.build(520, head=head), 1)
        first.append(a.ttft)
        repeat.append(b.ttft)
        other.append(c.ttft)
        cached.append(float(b.cached_tokens) if b.cached_tokens is not None else None)
    t.figures["prefix_first_ttft_s"] = _median(first)
    t.figures["prefix_repeat_ttft_s"] = _median(repeat)
    t.figures["prefix_new_tail_ttft_s"] = _median(other)
    t.figures["prefix_repeat_cached_tokens"] = _median(cached)


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


async def run_target(t: Target, quick: bool, max_seconds: float) -> None:
    """All measurements for one target, stopping at ``max_seconds`` with what it has."""
    deadline = time.monotonic() + max_seconds
    peak, stop = [0], asyncio.Event()
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(timeout=120.0, limits=limits, trust_env=False) as client:
        models = (await client.get(f"{t.base_url}/v1/models")).json()["data"]
        t.model = models[0]["id"]
        sampler = asyncio.create_task(sample_rss(t.pid, peak, stop)) if t.pid else None
        prompts = Prompts(client, t)
        await stream_chat(client, t, await prompts.build(50), 8)  # warm-up, not counted
        reps = 2 if quick else 5
        phases = [
            measure_ttft(client, t, prompts, reps),
            measure_decode(client, t, prompts, 1 if quick else 3),
            measure_concurrent(client, t, prompts, 8, deadline),
            measure_concurrent(client, t, prompts, 32, deadline),
            measure_prefix(client, t, prompts, 1 if quick else 3),
        ]
        try:
            for phase in phases:
                await asyncio.wait_for(phase, max(1.0, deadline - time.monotonic()))
        except TimeoutError:
            print(f"[{t.name}] stopped at --max-seconds; later figures missing", file=sys.stderr)
        finally:
            for phase in phases:
                phase.close()  # the ones never awaited
            stop.set()
            if sampler:
                await sampler
    t.figures["peak_rss_mib"] = peak[0] / 2**20 if peak[0] else None


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
        await run_target(t, args.quick, args.max_seconds)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm", action="store_true", help="start a vLLM worker and bench it")
    ap.add_argument("--jax", action="store_true", help="start the JAX worker and bench it")
    ap.add_argument("--target", action="append", default=[], help="name=URL[@PID], repeatable")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--max-seconds", type=float, default=900.0, help="per target")
    ap.add_argument("--json", type=Path, help="also write the figures here")
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
