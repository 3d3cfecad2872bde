"""Spill-over from a real vLLM server to a managed API under a burst, through the gateway.

Starts one real vLLM server (the CPU build; ``bash scripts/setup_vllm.sh`` first) and a managed
API faked at the HTTP layer (``tests.fixtures.fake_openai.FakeOpenAI``, OpenAI's wire format,
its time to first token set by ``--managed-ttft-s``), then, one after the other, a real
``switchyard serve`` per mode with one alias ``chat``:

- ``local-only``: the vLLM server alone. Nothing saturates it: the CPU build's API server
  batches up to 128 sequences (``max_num_seqs``), so the whole burst runs in vLLM's batch and
  every request shares the one core its engine runs on.
- ``spill``: the vLLM server first, counted as saturated while the gateway has
  ``--max-in-flight`` requests in flight to it, then the managed API (priority order).

Each mode gets the same burst: streamed requests arriving at ``--rate`` per second
(exponential gaps, seeded) for ``--burst-s`` seconds, each a ~``--prompt-words``-word question
with ``--max-tokens`` output tokens (``ignore_eos``, so vLLM decodes them all). When the
burst is over, ``--after`` requests go one at a time: where they land shows traffic coming
back to the local server.

Figures per mode: requests served by vLLM and by the managed API, and each per second of the
burst's wall time; TTFT p50/p95 at the client (time to the first content chunk) over all
requests and per upstream; errors; the share of the after-burst requests served locally;
and, as a check, what each upstream counted itself: vLLM's ``vllm:request_success_total``
delta and the fake's request log, which must equal what the gateway says each served. Every
request has a client timeout and each burst a deadline, so the run always ends.

Run from the repository root (about 2-3 minutes on two cores, most of it vLLM's start)::

    .venv/bin/python -m bench.spillover_vllm [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from bench.routing_e2e.gateway import Gateway
from local_tier.vllm.process import VllmProcess, VllmSettings, WorkerProcess, free_port
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve

MODEL = "smollm2-135m-instruct"
MANAGED_MODEL = "m-slow"  # the fake waits slow_seconds before it answers: the managed TTFT
MODES = ("local-only", "spill")
WORDS = ("river", "stone", "bread", "music", "paper", "garden", "window", "cloud", "light", "road")


@dataclass
class Outcome:
    """One request as the client saw it."""

    provider: str | None = None  # x-switchyard-provider
    ttft: float | None = None
    error: str | None = None


@dataclass
class ModeResult:
    mode: str
    burst: list[Outcome]
    wall_s: float
    after: list[Outcome]
    vllm_served: float  # vllm:request_success_total delta over the burst
    fake_served: int  # chat requests the managed fake received during the burst


# ---------------------------------------------------------------- the gateway's policy
def gateway_config(mode: str, vllm_url: str, managed_url: str, args: argparse.Namespace) -> str:
    """The policy file for ``mode``, as JSON (valid YAML)."""
    local: dict[str, Any] = {
        "type": "vllm",
        "base_url": f"{vllm_url}/v1",
        "first_token_timeout_s": 300,
        "saturation": {"stale_after_s": 10},
    }
    targets = [{"provider": "local", "model": MODEL}]
    providers: dict[str, Any] = {"local": local}
    if mode == "spill":
        local["saturation"]["max_in_flight"] = args.max_in_flight
        providers["managed"] = {"type": "openai", "base_url": f"{managed_url}/v1"}
        targets.append({"provider": "managed", "model": MANAGED_MODEL})
    config = {
        "server": {"watch_config": False},
        "state": {"backend": "memory"},
        "logging": {"level": "warning", "json": True},
        "providers": providers,
        "models": {"chat": {"targets": targets}},
    }
    return json.dumps(config, indent=2)


# ---------------------------------------------------------------- the client
def question(rng: random.Random, words: int) -> str:
    return "Write a short story using these words: " + " ".join(
        rng.choice(WORDS) for _ in range(words)
    )


async def one_request(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Outcome:
    """One streamed chat completion through the gateway: who served it and its TTFT."""
    out, started = Outcome(), time.perf_counter()
    try:
        async with aconnect_sse(client, "POST", f"{url}/v1/chat/completions", json=body) as sse:
            if sse.response.status_code != 200:
                await sse.response.aread()
                out.error = f"{sse.response.status_code} {sse.response.text[:200]}"
                return out
            out.provider = sse.response.headers.get("x-switchyard-provider")
            async for event in sse.aiter_sse():
                if event.data == "[DONE]":
                    break
                chunk = json.loads(event.data)
                if "error" in chunk:
                    out.error = str(chunk["error"])[:200]
                    break
                for choice in chunk.get("choices") or []:
                    if (choice.get("delta") or {}).get("content") and out.ttft is None:
                        out.ttft = time.perf_counter() - started
    except (httpx.HTTPError, ValueError) as exc:
        out.error = repr(exc)[:200]
    return out


def request_body(
    rng: random.Random, args: argparse.Namespace, model: str = "chat"
) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": question(rng, args.prompt_words)}],
        "max_tokens": args.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "ignore_eos": True,
    }


def arrivals(rng: random.Random, args: argparse.Namespace) -> list[float]:
    """Arrival offsets (s) of the burst: exponential gaps at ``args.rate``/s, the first at 0,
    none at or past ``args.burst_s``. Drawn in advance, so every mode gets the same burst."""
    offsets, at = [], 0.0
    while at < args.burst_s:
        offsets.append(at)
        at += rng.expovariate(args.rate)
    return offsets


async def burst(url: str, args: argparse.Namespace) -> tuple[list[Outcome], float]:
    """The burst through the gateway at ``url``: outcomes in arrival order, and the wall time
    from the first arrival to the last answer (bounded by ``args.deadline_s``)."""
    rng = random.Random(args.seed)  # the same arrivals and prompts in every mode
    schedule = [(at, request_body(rng, args)) for at in arrivals(rng, args)]
    timeout = httpx.Timeout(args.deadline_s, connect=10)
    limits = httpx.Limits(max_connections=1000)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        started = time.monotonic()
        tasks: list[asyncio.Task[Outcome]] = []
        for at, body in schedule:
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            tasks.append(asyncio.create_task(one_request(client, url, body)))
        done, pending = await asyncio.wait(tasks, timeout=args.deadline_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall = time.monotonic() - started
    return [t.result() if t in done else Outcome(error="deadline") for t in tasks], wall


async def one_at_a_time(
    url: str, args: argparse.Namespace, count: int, model: str = "chat"
) -> list[Outcome]:
    """``count`` requests, each sent when the one before has finished."""
    rng = random.Random(args.seed + 1)
    timeout = httpx.Timeout(args.deadline_s, connect=10)
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
        return [
            await one_request(client, url, request_body(rng, args, model)) for _ in range(count)
        ]


def vllm_served(server: WorkerProcess) -> float:
    """``vllm:request_success_total`` summed over its finish reasons."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=10, trust_env=False).text
    prefix = "vllm:request_success_total"
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((prefix + "{", prefix + " "))
    )


# ---------------------------------------------------------------- runs
def run_mode(
    mode: str, server: WorkerProcess, managed: tuple[FakeOpenAI, str], args: argparse.Namespace
) -> ModeResult:
    """One gateway with ``mode``'s policy in front of ``server``: the burst, then the rest."""
    with tempfile.TemporaryDirectory(prefix=f"bench-spill-{mode}-") as tmp_name:
        tmp = Path(tmp_name)
        config = tmp / "switchyard.yaml"
        fake, fake_url = managed
        config.write_text(gateway_config(mode, server.base_url, fake_url, args))
        gateway = Gateway(config, tmp / "gateway.log")
        gateway.spawn()
        try:
            gateway.wait_ready()
            time.sleep(1.0)  # a few /metrics polls: until the first, the server counts as full
            print(f"[bench] {mode}: burst", file=sys.stderr)
            before, fake_before = vllm_served(server), len(fake.requests)
            outcomes, wall = asyncio.run(burst(gateway.url, args))
            time.sleep(1.0)  # vLLM's API process counts a request just after it answers
            served = vllm_served(server) - before
            fake_served = len(fake.requests) - fake_before
            after = asyncio.run(one_at_a_time(gateway.url, args, args.after))
        finally:
            gateway.stop()
    return ModeResult(mode, outcomes, wall, after, served, fake_served)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def summarize(result: ModeResult) -> dict[str, float | None]:
    ok = [o for o in result.burst if o.error is None]
    local = [o for o in ok if o.provider == "local"]
    spilled = [o for o in ok if o.provider == "managed"]
    figures: dict[str, float | None] = {
        "requests": float(len(result.burst)),
        "errors": float(len(result.burst) - len(ok)),
        "served_by_vllm": float(len(local)),
        "served_by_managed": float(len(spilled)),
        "vllm_metrics_served": result.vllm_served,
        "managed_fake_served": float(result.fake_served),
        "vllm_req_per_s": len(local) / result.wall_s,
        "managed_req_per_s": len(spilled) / result.wall_s,
        "burst_wall_s": result.wall_s,
    }
    for name, group in (("all", ok), ("vllm", local), ("managed", spilled)):
        ttfts = [o.ttft for o in group if o.ttft is not None]
        figures[f"ttft_p50_{name}_s"] = statistics.median(ttfts) if ttfts else None
        figures[f"ttft_p95_{name}_s"] = _pct(ttfts, 0.95)
    after_ok = [o for o in result.after if o.error is None]
    figures["after_burst_vllm_share"] = (
        sum(o.provider == "local" for o in after_ok) / len(after_ok) if after_ok else None
    )
    return figures


def render(results: list[ModeResult]) -> str:
    figures = {r.mode: summarize(r) for r in results}
    names = list(figures)
    rows = ["| figure | " + " | ".join(names) + " |", "|" + " --- |" * (len(names) + 1)]
    for key in dict.fromkeys(k for f in figures.values() for k in f):
        cells = [figures[n].get(key) for n in names]
        rows.append(
            f"| {key} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in cells) + " |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rate", type=float, default=8.0, help="burst arrivals per second")
    ap.add_argument("--burst-s", type=float, default=4.0, help="how long arrivals last")
    ap.add_argument("--prompt-words", type=int, default=150, help="~1.3 tokens per word")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-in-flight", type=int, default=4, help="spill: saturation limit")
    ap.add_argument("--managed-ttft-s", type=float, default=0.4, help="the fake's TTFT")
    ap.add_argument("--after", type=int, default=4, help="one-at-a-time requests after")
    ap.add_argument("--deadline-s", type=float, default=240.0, help="per burst and request")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        ap.error(f"unknown modes {sorted(unknown)}; choose from {MODES}")

    app = FakeOpenAI()
    app.slow_seconds = args.managed_ttft_s
    with (
        tempfile.TemporaryDirectory(prefix="bench-spill-") as tmp,
        VllmProcess(
            VllmSettings(port=free_port(), served_model_name=MODEL),
            log_path=Path(tmp) / "vllm.log",
        ) as server,
        serve(app) as fake,
    ):
        started = time.monotonic()
        server.start().wait_healthy(timeout=900)
        print(f"[bench] vLLM healthy in {time.monotonic() - started:.0f} s", file=sys.stderr)
        # One request straight to vLLM first: its first one pays for kernel set-up.
        (warm,) = asyncio.run(one_at_a_time(server.base_url, args, 1, model=MODEL))
        if warm.error:
            raise RuntimeError(f"vLLM's warm-up request failed: {warm.error}")
        results = [run_mode(mode, server, (app, fake.url), args) for mode in modes]
    print(render(results))
    if args.json:
        args.json.write_text(json.dumps({r.mode: summarize(r) for r in results}, indent=2))


if __name__ == "__main__":
    main()
