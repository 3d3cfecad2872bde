"""KV cache sizing from device memory: the arithmetic with injected numbers, the sources of
the numbers (memory_stats, /proc/meminfo) and the refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from local_tier.jax.gguf_loader import HParams
from local_tier.jax.memory import (
    GIB,
    DeviceMemory,
    device_memory,
    fixed_kv_cache,
    kv_bytes_per_token,
    mem_available,
    plan_kv_cache,
    step_activation_bytes,
)

SMOLLM2 = HParams(
    n_layers=30,
    d_model=576,
    d_ff=1536,
    n_heads=9,
    n_kv_heads=3,
    head_dim=64,
    vocab_size=49152,
    context_length=8192,
    rope_base=100000.0,
    rms_eps=1e-5,
)


class FakeDevice:
    """Stands in for a JAX device: only ``platform`` and ``memory_stats`` are read."""

    platform = "gpu"

    def __init__(self, stats: dict[str, int] | None) -> None:
        self.stats = stats

    def memory_stats(self) -> dict[str, int] | None:
        return self.stats


def test_bytes_per_token_of_smollm2_bf16() -> None:
    assert kv_bytes_per_token(SMOLLM2, 2) == 30 * 3 * 64 * 2 * 2 == 23040


def test_plan_is_the_formula_rounded_down_to_blocks() -> None:
    mem = DeviceMemory(limit=10 * GIB, in_use=GIB, source="test")
    plan = plan_kv_cache(0.5, mem, 2 * GIB, GIB // 2, 23040, 16)
    left = 5 * GIB - GIB - 2 * GIB - GIB // 2  # 1.5 GiB
    assert plan.tokens == left // 23040 // 16 * 16 == 69904
    assert plan.bytes == 69904 * 23040
    assert plan.report().startswith("KV cache: 69904 tokens (1.50 GiB, 22.5 KiB per token); ")
    assert "0.5 x 10.00 GiB (test)" in plan.report()


def test_tensor_parallel_splits_weights_and_multiplies_the_budget() -> None:
    mem = DeviceMemory(limit=8 * GIB, in_use=0, source="test")
    plan = plan_kv_cache(1.0, mem, 4 * GIB, GIB, 1024, 16, devices=4)
    assert plan.tokens == 4 * (8 * GIB - GIB - GIB) // 1024 // 16 * 16
    assert "x 4 devices" in plan.report()


def test_a_fraction_that_leaves_no_room_is_refused() -> None:
    mem = DeviceMemory(limit=4 * GIB, in_use=0, source="test")
    with pytest.raises(ValueError, match=r"kv_cache_fraction=0.2 leaves no room"):
        plan_kv_cache(0.2, mem, GIB, 0, 23040, 16)
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"kv_cache_fraction must be in \(0, 1\]"):
            plan_kv_cache(bad, mem, 0, 0, 23040, 16)


def test_fixed_cache_rounds_to_blocks() -> None:
    plan = fixed_kv_cache(1000, 23040, 16)
    assert plan.tokens == 992 and "kv_cache_tokens" in plan.report()


def test_memory_from_memory_stats(tmp_path: Path) -> None:
    dev = FakeDevice({"bytes_limit": 100, "bytes_in_use": 30, "peak_bytes_in_use": 50})
    assert device_memory(dev, str(tmp_path / "none")) == DeviceMemory(100, 30, "gpu memory_stats")


def test_memory_of_a_cpu_device_from_meminfo(tmp_path: Path) -> None:
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:  16000000 kB\nMemFree: 100 kB\nMemAvailable:   8000000 kB\n")
    assert mem_available(str(info)) == 8000000 * 1024
    got = device_memory(FakeDevice(None), str(info))
    assert got == DeviceMemory(8000000 * 1024, 0, "host MemAvailable")


def test_unknown_memory_names_the_field(tmp_path: Path) -> None:
    class Raises(FakeDevice):
        def memory_stats(self) -> Any:
            raise RuntimeError("not supported")

    with pytest.raises(ValueError, match=r"kv_cache_fraction.*set kv_cache_tokens"):
        device_memory(Raises(None), str(tmp_path / "missing"))


shapes = st.tuples(st.integers(1, 64), st.integers(1, 512), st.integers(0, 4096))


@given(shapes, shapes)
def test_activation_estimate_grows_with_the_shape(a: Any, b: Any) -> None:
    big = tuple(max(x, y) for x, y in zip(a, b, strict=True))
    assert step_activation_bytes(SMOLLM2, big) >= step_activation_bytes(SMOLLM2, a)
    assert step_activation_bytes(SMOLLM2, a) > 0
    # reading the context 256 tokens at a time never needs more than reading it whole
    chunked = step_activation_bytes(SMOLLM2, big, chunk_tokens=256)
    assert 0 < chunked <= step_activation_bytes(SMOLLM2, big)
    if big[2] > 256:
        assert chunked < step_activation_bytes(SMOLLM2, big)
