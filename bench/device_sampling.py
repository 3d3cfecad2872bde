"""Micro-benchmark of device-side sampling (``local_tier/jax/device_sampling.py``) against the
host NumPy sampler (``local_tier/jax/sampling.py``) on the same logits.

    .venv/bin/python bench/device_sampling.py [--vocab 49152] [--batches 1,8,32] [--repeats 20]

For each batch size and case it prints the median time of one jitted ``sample`` call (inputs
already on the device, result waited for) and of the host path (one ``Sampler.sample`` per row,
float32 logits already in host memory: the device-to-host copy is not counted). "no branches"
is ``sample(..., branches=False)`` (every part computed; the GPU setting). Cases:

- ``greedy``: every row temperature 0 (the device's short path: processors + argmax);
- ``temp``: temperature 0.8, no top-k/top-p (no filter: two-level inverse-CDF draw);
- ``k50 p0.9``: top-k 50 + top-p 0.9 (thresholds from the 64-token probe);
- ``p0.9 flat``: top-p 0.9 on flat logits (the nucleus is wider than the probe: bisection);
- ``penalty``: temperature 0.8 + repetition_penalty 1.2 over 500 seen ids + min_tokens.

Runs on JAX's default device (CPU here; ``JAX_PLATFORMS=cuda`` etc. for an accelerator).
About 20-40 s on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The engine's XLA flags (set before JAX starts, as the engine does): without them XLA:CPU
# page-faults this function's (B, V) scratch afresh on every call (B=32: 10 ms instead of 2).
from local_tier.jax import backend  # noqa: F401, I001

import jax
import msgspec
import numpy as np

from local_tier.jax import device_sampling as D
from local_tier.jax.api import SamplingParams
from local_tier.jax.sampling import Sampler

CASES: dict[str, tuple[SamplingParams, float]] = {  # params, logit scale (std)
    "greedy": (SamplingParams(temperature=0.0), 6.0),
    "temp": (SamplingParams(temperature=0.8), 6.0),
    "k50 p0.9": (SamplingParams(temperature=0.8, top_k=50, top_p=0.9), 6.0),
    "p0.9 flat": (SamplingParams(temperature=1.0, top_p=0.9), 1.0),
    "penalty": (SamplingParams(temperature=0.8, repetition_penalty=1.2, min_tokens=5), 6.0),
}


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up (compile, page faults)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def bench_case(name: str, b: int, vocab: int, repeats: int, rng: np.random.Generator) -> str:
    params, scale = CASES[name]
    logits = (rng.normal(size=(b, vocab)) * scale).astype(np.float32)
    seen = rng.integers(0, vocab, size=500).tolist()
    end = [0, 2]
    rows = [
        D.RowState(msgspec.structs.replace(params, seed=i), D.key_data_for_seed(i), 0, end, seen)
        for i in range(b)
    ]
    arrays = jax.device_put(D.build_arrays(rows, b, vocab, end_width=4))
    dev_logits = jax.device_put(logits)
    sample = jax.jit(D.sample, static_argnames=("branches",))
    dev = median_ms(lambda: sample(dev_logits, arrays).block_until_ready(), repeats)
    flat = median_ms(
        lambda: sample(dev_logits, arrays, branches=False).block_until_ready(), repeats
    )
    samplers = [Sampler(r.params, seen, end) for r in rows]
    host = median_ms(
        lambda: [s.sample(logits[i], []) for i, s in enumerate(samplers)], max(3, repeats // 4)
    )
    return (
        f"B={b:<3} {name:<10} device {dev:7.2f} ms   no branches {flat:7.2f} ms"
        f"   host {host:7.2f} ms   host/device {host / dev:5.1f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    print(f"device: {jax.devices()[0]}  vocab {args.vocab}  (median of {args.repeats})")
    rng = np.random.default_rng(0)
    for b in (int(x) for x in args.batches.split(",")):
        for name in CASES:
            print(bench_case(name, b, args.vocab, args.repeats, rng), flush=True)


if __name__ == "__main__":
    main()
