"""Micro-benchmark of the JAX engine itself (no HTTP): decode and prefill throughput.

    .venv/bin/python bench/engine_micro.py [--dtype bfloat16] [--backend auto] [--batches 1,8,32]

Prints, after a warm-up run of each shape (first runs pay compiles and page faults):
- decode tok/s at each batch size: B streams of greedy tokens (EOS ignored), counted from the
  moment every stream has its first token to the end, so prefill is excluded; with the step
  loop's host time per step and its share of the loop (``Engine.timing``; ``--pipeline off``
  runs one step at a time instead of one step behind);
- prefill: time to first token and prompt tok/s for 100- and 500-token prompts (fresh token
  ids each run, so the prefix cache cannot help);
- the memory-bandwidth limit of batch-1 decode: the device's streaming-read bandwidth (a
  jitted sum over 1 GiB, all threads, median of 5) divided by the bytes one decode step must
  read (every weight array, the tied embedding once), and batch-1 decode as a share of it.
It runs on whatever device the engine picks (TPU > GPU > CPU) unless --backend says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from local_tier.jax import (
    Engine,
    EngineConfig,
    GenerationRequest,
    SamplingParams,
    render_chat_prompt,
)
from local_tier.jax.engine import LoopTiming
from local_tier.jax.setup import kv_dtype_for

_counter = iter(range(10**9))


def fresh_prompt(n: int) -> list[int]:
    """n token ids no earlier prompt started with (defeats the prefix cache)."""
    k = next(_counter)
    return [100 + (k * 7919 + i * 31) % 40000 for i in range(n)]


async def one(engine: Engine, prompt: list[int], max_tokens: int) -> tuple[float, float, int]:
    """(time of first token, time of last token, tokens) for one greedy stream."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    first = last = 0.0
    n = 0
    async for out in engine.generate(GenerationRequest(f"b{next(_counter)}", prompt, params)):
        now = time.perf_counter()
        if out.token_ids and not first:
            first = now
        last, n = now, n + len(out.token_ids)
    return first, last, n


async def decode_rate(engine: Engine, batch: int, max_tokens: int, prompt_len: int) -> float:
    runs = await asyncio.gather(
        *[one(engine, fresh_prompt(prompt_len), max_tokens) for _ in range(batch)]
    )
    start = max(r[0] for r in runs)  # every stream is decoding from here on
    end = max(r[1] for r in runs)
    # tokens produced after `start`: each stream's tokens beyond its first, roughly
    produced = sum(r[2] - 1 for r in runs)
    return produced / max(end - start, 1e-9)


def host_share(before: LoopTiming, engine: Engine) -> str:
    """The step loop's host work on its critical path since ``before``: per step, and as a
    share of the loop's busy time (the rest is waiting on the device), plus the share of
    steps dispatched before the previous step's tokens were read (one step behind)."""
    now = engine.timing
    steps = max(now.steps - before.steps, 1)
    busy = max(now.busy_s - before.busy_s, 1e-9)
    host = now.host_s - before.host_s
    chained = (now.chained - before.chained) / steps
    return (
        f"host {1e3 * host / steps:.2f} ms/step = {100 * host / busy:.1f}% of the loop, "
        f"step {1e3 * busy / steps:.1f} ms, {100 * chained:.0f}% chained"
    )


async def ttft(engine: Engine, n: int) -> float:
    t0 = time.perf_counter()
    first, _, _ = await one(engine, fresh_prompt(n), 1)
    return first - t0


async def sanity(engine: Engine) -> str:
    """The greedy answer to the chat prompt the tests pin (fp32: 'The capital of France is
    Paris.')."""
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = engine.tokenizer.encode(render_chat_prompt(engine.tokenizer, msgs))
    params = SamplingParams(temperature=0.0, max_tokens=20)
    return "".join([o.text async for o in engine.generate(GenerationRequest("s", prompt, params))])


def read_bandwidth(device: Any, n_bytes: int = 1 << 30) -> float:
    """Bytes/s of a jitted full read (sum) of an n_bytes fp32 array on ``device``."""
    import jax  # after local_tier.jax, which sets XLA_FLAGS before JAX starts
    import jax.numpy as jnp

    x = jax.device_put(jnp.ones(n_bytes // 4, jnp.float32), device)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        total(x).block_until_ready()
        times.append(time.perf_counter() - t0)
    return n_bytes / statistics.median(times)


async def report(engine: Engine, args: argparse.Namespace) -> None:
    """Decode tok/s per batch size, then TTFT for 100- and 500-token prompts, then the
    bandwidth limit of batch-1 decode."""
    rates_by_batch: dict[int, float] = {}
    for batch in args.batches:
        await decode_rate(engine, batch, 8, args.prompt_len)  # warm-up (compiles, page faults)
        before = dataclasses.replace(engine.timing)
        rates = [
            await decode_rate(engine, batch, args.max_tokens, args.prompt_len)
            for _ in range(args.repeats)
        ]
        rates_by_batch[batch] = statistics.median(rates)
        print(
            f"decode B={batch:<3d} {statistics.median(rates):8.1f} tok/s total "
            f"({statistics.median(rates) / batch:6.1f} per stream); {host_share(before, engine)}",
            flush=True,
        )
    for n in (100, 500):
        await ttft(engine, n)  # warm-up
        times = [await ttft(engine, n) for _ in range(args.repeats)]
        med = statistics.median(times)
        print(f"prefill {n:3d} tokens: TTFT {med:.3f}s ({n / med:7.1f} tok/s)", flush=True)
    bandwidth, per_token = read_bandwidth(engine.device), engine.decode_weight_bytes
    limit = bandwidth / per_token
    print(
        f"memory bandwidth {bandwidth / 1e9:.1f} GB/s; decode reads {per_token / 1e6:.0f} MB "
        f"of weights per step -> batch-1 limit {limit:.1f} tok/s",
        flush=True,
    )
    if 1 in rates_by_batch:
        print(f"batch-1 decode at {100 * rates_by_batch[1] / limit:.0f}% of that limit")


async def main(args: argparse.Namespace) -> None:
    config = EngineConfig(
        model_path=args.model_path,
        dtype=args.dtype,
        backend=args.backend,
        max_batch_size=max(args.batches),
        kv_cache_tokens=args.kv_cache_tokens,
        max_model_len=args.max_model_len,
        warmup=not args.no_warmup,
        pipeline_decode=args.pipeline == "on",
    )
    t0 = time.perf_counter()
    engine = Engine.from_config(config, progress=lambda m: print(f"  [load] {m}", flush=True))
    await engine.start()
    print(
        f"ready in {time.perf_counter() - t0:.1f}s on {engine.device.platform}; "
        f"weights {args.dtype}, KV {config.kv_dtype or kv_dtype_for(args.dtype)}",
        flush=True,
    )
    print(f"greedy answer: {await sanity(engine)!r}", flush=True)
    await report(engine, args)
    print(engine.stats())
    await engine.stop()


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "int8"])
    p.add_argument("--backend", default="auto", choices=["auto", "cpu", "gpu", "tpu"])
    p.add_argument("--batches", default="1,8,32", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--max-tokens", default=64, type=int)
    p.add_argument("--prompt-len", default=32, type=int)
    p.add_argument("--repeats", default=3, type=int)
    p.add_argument("--kv-cache-tokens", default=32768, type=int)
    p.add_argument("--max-model-len", default=2048, type=int)
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--pipeline", default="on", choices=["on", "off"], help="one step behind")
    p.add_argument("--model-path", default=None, help="a GGUF file (default: bundled SmolLM2)")
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
