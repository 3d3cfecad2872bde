"""Batch work on the local model next to interactive traffic: does the batch slow people down?

Run from the repository root (takes a few minutes; stops by itself)::

    .venv/bin/python -m bench.batch_local                     # 2 seeds, 48 items each
    .venv/bin/python -m bench.batch_local --seeds 1,2,3 --items 96 --probes 20

Per seed it starts one real ``switchyard serve`` on the bundled SmolLM2-135M (the in-process
JAX engine, CPU), with batches run at ``batch.concurrency`` items at once, the engine
pausing batch items (priority 1) while an interactive request runs, and by default
``yield_above_in_flight: 0`` (no new item while an interactive request is in flight, nor
within ``yield_quiet_s`` of the last one's end; ``--yield-above 16`` leaves the holding back
to the engine alone), then:

0. **warm-up**: a batch of ``2 x concurrency`` items with probes beside it, so the engine
   has compiled the batch shapes the measurement meets (it compiles each on first use);
1. **idle**: ``--probes`` interactive streamed chat requests, one after another with a
   random pause (0.2-4 s: shorter and longer than ``batch.yield_quiet_s``) between them;
   TTFT is timed at the client (official ``openai`` SDK) to the first content chunk;
2. **batch**: uploads ``--items`` chat requests (``max_tokens`` 32, ``ignore_eos`` is not
   available through the API, so outputs may end early: the tokens come from the batch's
   ``usage``), creates the batch and, while it runs, sends the same kind of probes;
   records the batch's wall time (``in_progress_at`` to ``completed_at``, whole seconds, so
   also timed at the client), items/s and output tokens/s.

It prints, per seed and pooled: TTFT p50/p95 idle and under the batch, their ratio, the
batch requests done while the probes ran (``beside``: how much the batch yielded), and the
batch's throughput. Prompts differ per seed and per probe (no prefix-cache hits).
Figures are this machine's (2 cores); run it alone.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from bench.routing_e2e.gateway import Gateway

ALIAS = "smollm2"
# Pauses between probes: shorter and longer than batch.yield_quiet_s (2 s), so some probes
# meet a paused batch and some arrive while batch items run.
GAP_S = (0.2, 4.0)
WORDS = [
    "river",
    "stone",
    "cloud",
    "lamp",
    "garden",
    "paper",
    "window",
    "music",
    "orange",
    "winter",
    "forest",
    "bridge",
]
CONFIG = """
server: {{watch_config: false}}
ledger: {{path: {folder}/usage.sqlite3}}
batch: {{concurrency: {concurrency}, yield_above_in_flight: {yield_above}, poll_interval_s: 0.2}}
logging: {{level: warning}}
providers:
  local: {{type: jax, max_batch_size: 8, max_model_len: 2048}}
models:
  {alias}:
    targets: [{{provider: local, model: smollm2-135m-instruct}}]
"""


def prompt(rng: random.Random, words: int = 40) -> str:
    return f"Session {rng.randrange(10**9)}: " + " ".join(rng.choice(WORDS) for _ in range(words))


def probe(client: openai.OpenAI, rng: random.Random) -> float:
    """One streamed request; seconds to its first content chunk."""
    start = time.perf_counter()
    stream = client.chat.completions.create(
        model=ALIAS,
        messages=[{"role": "user", "content": prompt(rng)}],
        max_tokens=8,
        temperature=0,
        stream=True,
    )
    ttft = None
    for chunk in stream:
        if ttft is None and chunk.choices and chunk.choices[0].delta.content:
            ttft = time.perf_counter() - start
    if ttft is None:
        raise RuntimeError("a probe streamed no content")
    return ttft


def probes(client: openai.OpenAI, rng: random.Random, count: int, until: Any = None) -> list[float]:
    """``count`` probes one after another (or fewer when ``until()`` turns true)."""
    found = []
    for _ in range(count):
        if until is not None and until():
            break
        found.append(probe(client, rng))
        time.sleep(rng.uniform(*GAP_S))
    return found


def batch_lines(rng: random.Random, items: int) -> bytes:
    lines = [
        {
            "custom_id": f"item-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": ALIAS,
                "max_tokens": 32,
                "temperature": 0,
                "messages": [{"role": "user", "content": prompt(rng)}],
            },
        }
        for i in range(items)
    ]
    return "\n".join(json.dumps(line) for line in lines).encode()


def submit(client: openai.OpenAI, lines: bytes) -> str:
    """Upload ``lines`` and create a batch of them; its id."""
    upload = client.files.create(file=("in.jsonl", lines), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return batch.id


def finished(client: openai.OpenAI, batch_id: str) -> bool:
    status = client.batches.retrieve(batch_id).status
    return status in ("completed", "failed", "expired", "cancelled")


def wait_done(client: openai.OpenAI, batch_id: str, limit_s: float) -> Any:
    """The batch once it ended; RuntimeError after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while not finished(client, batch_id):
        if time.monotonic() > deadline:
            raise RuntimeError("the batch did not finish in --max-seconds")
        time.sleep(0.5)
    return client.batches.retrieve(batch_id)


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = folder / "config.yaml"
        text = CONFIG.format(
            folder=folder, concurrency=args.concurrency, alias=ALIAS, yield_above=args.yield_above
        )
        config.write_text(text)
        gateway = Gateway(config, folder / "gateway.log")
        gateway.spawn()
        try:
            gateway.wait_ready(timeout_s=args.max_seconds)  # the engine compiles its shapes
            client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="none", timeout=120)
            # Warm-up: the engine compiles each batch shape on first use; a small batch
            # with probes beside it compiles the ones the measurement will meet.
            warm = submit(client, batch_lines(rng, 2 * args.concurrency))
            probes(client, rng, 3, until=lambda: finished(client, warm))
            wait_done(client, warm, args.max_seconds)
            idle = probes(client, rng, args.probes)
            batch = submit(client, batch_lines(rng, args.items))
            started = time.monotonic()
            busy = probes(client, rng, args.probes, until=lambda: finished(client, batch))
            beside = client.batches.retrieve(batch).request_counts
            done = wait_done(client, batch, args.max_seconds)
            wall = time.monotonic() - started
        finally:
            gateway.stop()
            if args.logs is not None:  # the engine's compile lines show where time went
                args.logs.mkdir(parents=True, exist_ok=True)
                shutil.copy(folder / "gateway.log", args.logs / f"gateway-seed{seed}.log")
    output = done.usage.output_tokens if done.usage else 0
    return {
        "seed": seed,
        "idle": idle,
        "busy": busy,
        "batch_status": done.status,
        "completed": done.request_counts.completed if done.request_counts else 0,
        "done_beside_probes": beside.completed if beside else 0,
        "wall_s": wall,
        "items_per_s": args.items / wall,
        "output_tok_per_s": output / wall,
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def report(results: list[dict[str, Any]]) -> None:
    print(
        f"{'seed':>6} {'idle p50':>9} {'idle p95':>9} {'busy p50':>9} {'busy p95':>9}"
        f" {'p50 x':>6} {'probes':>7} {'beside':>6} {'items':>6} {'wall s':>7}"
        f" {'items/s':>8} {'tok/s':>7}"
    )
    for r in results:
        ratio = statistics.median(r["busy"]) / statistics.median(r["idle"]) if r["busy"] else 0
        print(
            f"{r['seed']:>6} {pct(r['idle'], 0.5) * 1000:>8.0f}m {pct(r['idle'], 0.95) * 1000:>8.0f}m"
            f" {pct(r['busy'], 0.5) * 1000:>8.0f}m {pct(r['busy'], 0.95) * 1000:>8.0f}m"
            f" {ratio:>6.2f} {len(r['busy']):>7} {r['done_beside_probes']:>6}"
            f" {r['completed']:>6} {r['wall_s']:>7.1f}"
            f" {r['items_per_s']:>8.2f} {r['output_tok_per_s']:>7.1f}"
        )
    idle = [t for r in results for t in r["idle"]]
    busy = [t for r in results for t in r["busy"]]
    if busy:
        print(
            f"pooled: TTFT p50 idle {pct(idle, 0.5) * 1000:.0f} ms, under the batch"
            f" {pct(busy, 0.5) * 1000:.0f} ms (x{pct(busy, 0.5) / pct(idle, 0.5):.2f});"
            f" p95 {pct(idle, 0.95) * 1000:.0f} -> {pct(busy, 0.95) * 1000:.0f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--items", type=int, default=48)
    parser.add_argument("--probes", type=int, default=15)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--yield-above",
        type=int,
        default=0,
        help="batch.yield_above_in_flight (0: the runner holds new items back while "
        "interactive requests run; higher: it keeps its slots and the engine's priority "
        "scheduling alone keeps interactive requests first)",
    )
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument("--logs", type=Path, help="keep each gateway's log in this folder")
    args = parser.parse_args()
    results = [run_seed(int(seed), args) for seed in args.seeds.split(",")]
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
