"""Prefix-aware vs round-robin local routing on a shared-prefix, multi-turn chat workload.

The workload: ``--users`` conversations, all opening with one long shared system prompt
(``--system-words``, ~1,000+ tokens), each ``--turns`` turns long; every turn appends a new
user message (``--user-words``) and the previous answer, so a conversation's prompt grows and
its earlier turns are a prefix of its next one. Users run concurrently (at most
``--concurrency`` requests in flight), turns of one user one after another with a random
pause between them (``--think-s``, exponential), as people read and type. Every request is
streamed (temperature 0, ``ignore_eos`` so answers have ``--max-tokens`` tokens).

Figures per run: prefix-cache hit rate from the workers' ``/metrics`` deltas
(``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total``, tokens), each worker's
share of the prompt tokens, TTFT p50/p90 (time to the first content chunk, client side),
requests/s and output tokens/s, errors. Each run stops launching turns at ``--max-seconds``
and cancels what is left shortly after, so it always ends.

Two ways to run it, from the repository root::

    # against a running gateway; --worker URLs are the workers behind the alias (for /metrics)
    .venv/bin/python -m bench.prefix_routing --gateway http://127.0.0.1:8080 --model local \
        --worker http://127.0.0.1:8001 --worker http://127.0.0.1:8002

    # start two JAX workers and, one after the other, a gateway with strategy prefix_aware
    # and one with round_robin (both workers as `type: vllm` targets); print side by side
    .venv/bin/python -m bench.prefix_routing --spawn [--quick] [--json out.json]

    # the same with two real vLLM servers (scripts/setup_vllm.sh first); on the CPU build a
    # KV block is 128 tokens, and each server's engine gets a core of its own (--cpu-bind)
    .venv/bin/python -m bench.prefix_routing --spawn --engine vllm --quick

In ``--spawn`` mode both runs share the same two workers: a warm-up compiles their shapes
first (a single short turn per server for vLLM, which runs eager and compiles nothing), and
each run uses its own random salt in the system prompt, so no run is served from blocks
another run left behind (the workers' LRU evicts those as needed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from local_tier.vllm.process import VllmProcess, VllmSettings, WorkerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"
_WORDS_TEXT = (
    "the cat dog sun red blue tree house water city road book time day night light green"
    " small big old new good man car river stone cloud bread music paper garden window"
)
WORDS = tuple(_WORDS_TEXT.split())


# ---------------------------------------------------------------- workload
def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def system_prompt(salt: int, n_words: int) -> str:
    rng = random.Random(salt)
    rules = [f"Rule {i}: {words(rng, 9)}." for i in range(max(1, n_words // 11))]
    return f"You are assistant #{salt}. Follow every rule below.\n" + "\n".join(rules)


@dataclass
class Turn:
    ttft: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None


@dataclass
class RunResult:
    name: str
    turns: list[Turn] = field(default_factory=list)
    wall_s: float = 0.0
    before: dict[str, tuple[float, float]] = field(default_factory=dict)
    after: dict[str, tuple[float, float]] = field(default_factory=dict)


async def stream_turn(
    client: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> tuple[Turn, str]:
    """One streamed chat completion: its timing, usage and the answer's text."""
    turn, text, started = Turn(), [], time.perf_counter()
    async with aconnect_sse(client, "POST", f"{url}/v1/chat/completions", json=body) as sse:
        if sse.response.status_code != 200:
            await sse.response.aread()
            turn.error = f"{sse.response.status_code} {sse.response.text[:200]}"
            return turn, ""
        async for event in sse.aiter_sse():
            if event.data == "[DONE]":
                break
            chunk = json.loads(event.data)
            if "error" in chunk:
                turn.error = str(chunk["error"])[:200]
                break
            for choice in chunk.get("choices") or []:
                if piece := (choice.get("delta") or {}).get("content"):
                    turn.ttft = turn.ttft or time.perf_counter() - started
                    text.append(piece)
                    turn.output_tokens += 1
            if usage := chunk.get("usage"):
                turn.output_tokens = usage.get("completion_tokens", turn.output_tokens)
                turn.prompt_tokens = usage.get("prompt_tokens")
                turn.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return turn, "".join(text)


async def run_user(
    client: httpx.AsyncClient,
    args: argparse.Namespace,
    user: int,
    system: str,
    gate: asyncio.Semaphore,
    stop_at: float,
    out: list[Turn],
) -> None:
    """One conversation: ``args.turns`` turns, each prompt extending the previous one."""
    rng = random.Random(user * 7919 + args.seed)
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    for number in range(args.turns):
        if number and args.think_s > 0:
            # Users read and type between turns: random think times shuffle the order in
            # which turns arrive. Without them, every user's turns come a fixed number of
            # requests apart and round robin sends each user to the same replica every time.
            await asyncio.sleep(rng.expovariate(1.0 / args.think_s))
        if time.monotonic() >= stop_at:
            return
        messages.append(
            {
                "role": "user",
                "content": f"User {user}, question {number}: " + words(rng, args.user_words),
            }
        )
        body = {
            "model": args.model,
            "messages": messages,
            "max_tokens": args.max_tokens,
            "temperature": 0.0,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
            "user": f"user-{user}",
        }
        async with gate:
            try:
                turn, answer = await stream_turn(client, args.gateway, body)
            except (httpx.HTTPError, ValueError) as exc:
                turn, answer = Turn(error=repr(exc)[:200]), ""
        out.append(turn)
        if turn.error:
            return  # the conversation cannot go on without its answer
        messages.append({"role": "assistant", "content": answer})


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def scrape(client: httpx.AsyncClient, workers: list[str]) -> dict[str, tuple[float, float]]:
    """Per worker: (prefix-cache hits, prefix-cache queries), tokens since it started."""
    out: dict[str, tuple[float, float]] = {}
    for url in workers:
        text = (await client.get(f"{url}/metrics", timeout=10)).text
        out[url] = (
            _metric(text, "vllm:prefix_cache_hits_total"),
            _metric(text, "vllm:prefix_cache_queries_total"),
        )
    return out


async def run_workload(name: str, args: argparse.Namespace, salt: int) -> RunResult:
    """The whole workload once through the gateway; bounded by ``args.max_seconds``."""
    result = RunResult(name)
    system = system_prompt(salt, args.system_words)
    limits = httpx.Limits(max_connections=args.concurrency * 2)
    timeout = httpx.Timeout(args.max_seconds, connect=10)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        result.before = await scrape(client, args.worker)
        gate = asyncio.Semaphore(args.concurrency)
        started = time.monotonic()
        stop_at = started + args.max_seconds
        users = [
            asyncio.create_task(run_user(client, args, u, system, gate, stop_at, result.turns))
            for u in range(args.users)
        ]
        # Past the deadline, turns in flight get a grace period, then are cancelled.
        _, pending = await asyncio.wait(users, timeout=args.max_seconds + args.grace_seconds)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        result.wall_s = time.monotonic() - started
        result.after = await scrape(client, args.worker)
    return result


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def summarize(result: RunResult) -> dict[str, float | None]:
    ok = [t for t in result.turns if t.error is None]
    ttfts = [t.ttft for t in ok if t.ttft is not None]
    figures: dict[str, float | None] = {
        "requests_ok": float(len(ok)),
        "errors": float(len(result.turns) - len(ok)),
        "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
        "ttft_p90_s": _pct(ttfts, 0.9),
        "requests_per_s": len(ok) / result.wall_s if result.wall_s else None,
        "output_tok_per_s": sum(t.output_tokens for t in ok) / result.wall_s
        if result.wall_s
        else None,
    }
    hits = {u: result.after[u][0] - result.before[u][0] for u in result.after}
    queries = {u: result.after[u][1] - result.before[u][1] for u in result.after}
    total = sum(queries.values())
    figures["prefix_hit_rate"] = sum(hits.values()) / total if total > 0 else None
    for index, url in enumerate(sorted(queries)):
        figures[f"worker{index + 1}_prompt_share"] = queries[url] / total if total else None
    cached = [t.cached_tokens for t in ok if t.cached_tokens is not None]
    prompt = [t.prompt_tokens for t in ok if t.prompt_tokens is not None]
    if cached and prompt:
        figures["usage_cached_share"] = sum(cached) / sum(prompt)
    return figures


def render(results: list[RunResult]) -> str:
    names = [r.name for r in results]
    figures = {r.name: summarize(r) for r in results}
    keys = list(dict.fromkeys(k for f in figures.values() for k in f))
    rows = ["| figure | " + " | ".join(names) + " |", "|" + " --- |" * (len(names) + 1)]
    for key in keys:
        cells = [figures[n].get(key) for n in names]
        rows.append(
            f"| {key} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in cells) + " |"
        )
    return "\n".join(rows)


# ---------------------------------------------------------------- --spawn
def gateway_config(strategy: str, workers: list[str]) -> str:
    """A policy file: the alias ``local`` over both workers as ``type: vllm`` targets."""
    providers = "\n".join(
        f"  w{i + 1}:\n    type: vllm\n    base_url: {url}/v1\n"
        f"    first_token_timeout_s: 300\n    saturation: {{max_waiting: 4, stale_after_s: 2.0}}"
        for i, url in enumerate(workers)
    )
    targets = "\n".join(
        f"      - {{provider: w{i + 1}, model: {MODEL}}}" for i in range(len(workers))
    )
    return (
        "server: {watch_config: false}\nlogging: {level: warning, json: true}\n"
        f"providers:\n{providers}\nmodels:\n  local:\n    strategy: {{type: {strategy}}}\n"
        f"    targets:\n{targets}\n"
    )


class Gateway:
    """``python -m gateway.cli serve`` on a free port, in its own session; stopped by PID."""

    def __init__(self, config: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gateway.cli",
                    "serve",
                    "--config",
                    str(config),
                    "--port",
                    str(self.port),
                ],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.log = log

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited:\n{self.log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(0.3)
        raise RuntimeError(f"gateway not ready in {timeout:.0f} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # our own session: only the gateway
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def jax_worker(args: argparse.Namespace, index: int, tmp: Path) -> WorkerProcess:
    """JAX worker ``index`` (``python -m local_tier.worker``) with the ``--spawn`` settings."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "local_tier.worker",
        "--port",
        str(port),
        "--served-model-name",
        MODEL,
        "--max-model-len",
        str(args.max_model_len),
        "--max-batch-size",
        str(args.batch),
        "--kv-cache-tokens",
        str(args.kv_tokens),
    ]
    return WorkerProcess(argv, port=port, log_path=tmp / f"worker{index}.log")


def vllm_server(args: argparse.Namespace, index: int, tmp: Path) -> WorkerProcess:
    """Real vLLM server ``index``; ``--cpu-bind spread`` pins its engine's threads to core
    ``index`` (mod the core count): with ``auto`` the CPU build pins every engine to core 0
    on a 2-core machine, so two servers would share one core and leave the other idle."""
    env = {}
    if args.cpu_bind == "spread":
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(index % (os.cpu_count() or 1))
    settings = VllmSettings(
        port=free_port(), served_model_name=MODEL, max_model_len=args.max_model_len, extra_env=env
    )
    return VllmProcess(settings, log_path=tmp / f"vllm{index}.log")


@contextlib.contextmanager
def spawned_workers(args: argparse.Namespace, tmp: Path) -> Iterator[list[WorkerProcess]]:
    """Two workers of ``args.engine``, started together, healthy, stopped on exit."""
    make = vllm_server if args.engine == "vllm" else jax_worker
    workers: list[WorkerProcess] = []
    try:
        for index in range(2):
            workers.append(make(args, index, tmp))
            workers[-1].start()
        for worker in workers:
            worker.wait_healthy(timeout=900)
        yield workers
    finally:
        for worker in workers:
            worker.stop()


async def warm_up(workers: list[str], args: argparse.Namespace) -> None:
    """Compile the workers' shapes with a short workload sent straight to each worker."""
    users, turns = (1, 1) if args.engine == "vllm" else (2, args.turns)
    warm = argparse.Namespace(**{**vars(args), "users": users, "turns": turns})
    for url in workers:
        run = argparse.Namespace(**{**vars(warm), "gateway": url, "model": MODEL, "worker": []})
        await run_workload("warm-up", run, salt=random.randrange(10**9))


def prompt_tokens(worker: str, args: argparse.Namespace) -> int | None:
    """The shared system prompt's length in tokens, as the worker's /tokenize counts it."""
    messages = [{"role": "system", "content": system_prompt(0, args.system_words)}]
    with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
        reply = httpx.post(
            f"{worker}/tokenize", json={"model": MODEL, "messages": messages}, timeout=30
        )
        return int(reply.json()["count"])
    return None


def spawn(args: argparse.Namespace) -> list[RunResult]:
    results: list[RunResult] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-prefix-") as tmp_name,
        spawned_workers(args, Path(tmp_name)) as workers,
    ):
        tmp = Path(tmp_name)
        urls = [w.base_url for w in workers]
        print(
            f"[bench] {args.engine} workers healthy: {urls}; system prompt "
            f"{prompt_tokens(urls[0], args)} tokens; warming up",
            file=sys.stderr,
        )
        asyncio.run(warm_up(urls, args))
        for strategy in args.strategies:
            config = tmp / f"{strategy}.yaml"
            config.write_text(gateway_config(strategy, urls))
            gateway = Gateway(config, tmp / f"gateway-{strategy}.log")
            try:
                gateway.wait_ready()
                run = argparse.Namespace(
                    **{**vars(args), "gateway": gateway.url, "model": "local", "worker": urls}
                )
                print(f"[bench] {strategy}: running", file=sys.stderr)
                results.append(asyncio.run(run_workload(strategy, run, random.randrange(10**9))))
            finally:
                gateway.stop()
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gateway", help="gateway base URL (without /v1)")
    ap.add_argument("--model", default="local", help="the model alias to call")
    ap.add_argument("--worker", action="append", default=[], help="a worker's base URL, repeat")
    ap.add_argument("--spawn", action="store_true", help="start 2 workers + 2 gateways")
    ap.add_argument(
        "--engine", choices=("jax", "vllm"), default="jax", help="--spawn: the workers' engine"
    )
    ap.add_argument(
        "--cpu-bind",
        choices=("spread", "auto"),
        default="spread",
        help="--engine vllm: one core per server's engine (spread) or vLLM's own choice",
    )
    ap.add_argument("--strategies", default="prefix_aware,round_robin")
    ap.add_argument("--users", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--system-words", type=int, default=800, help="~1.3 tokens per word")
    ap.add_argument("--user-words", type=int, default=60)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--think-s", type=float, default=2.0, help="mean pause between turns")
    ap.add_argument("--max-seconds", type=float, default=300.0, help="per run")
    ap.add_argument("--grace-seconds", type=float, default=60.0)
    ap.add_argument("--max-model-len", type=int, default=2048, help="--spawn workers")
    ap.add_argument("--batch", type=int, default=8, help="--spawn JAX workers' max batch size")
    ap.add_argument("--kv-tokens", type=int, default=32768, help="--spawn JAX workers' KV pool")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="8 users x 3 turns, 120 s per run")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    args.strategies = [s for s in args.strategies.split(",") if s]
    if args.quick:
        args.users, args.turns, args.max_seconds = 8, 3, min(args.max_seconds, 120.0)
    if not args.spawn and not args.gateway:
        ap.error("give --gateway URL (and --worker URLs) or --spawn")
    if args.gateway:
        args.gateway = args.gateway.rstrip("/").removesuffix("/v1")
    args.worker = [w.rstrip("/").removesuffix("/v1") for w in args.worker]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.spawn:
        results = spawn(args)
    else:
        results = [asyncio.run(run_workload(args.model, args, args.seed))]
    print(render(results))
    if args.json:
        args.json.write_text(json.dumps({r.name: summarize(r) for r in results}, indent=2))


if __name__ == "__main__":
    main()
