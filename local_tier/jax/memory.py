"""KV cache sizing from the device's memory (``EngineConfig.kv_cache_fraction``).

Like vLLM's ``--gpu-memory-utilization``: the engine may use ``fraction`` of the device's
memory; what the weights and the largest step's activations do not need becomes KV cache::

    per device = fraction x limit - in use - weights / devices - activation reserve
    KV tokens  = per device x devices // bytes per token, rounded down to whole blocks

``limit`` and ``in use`` come from ``device.memory_stats()`` (``bytes_limit``, the most JAX's
allocator may take, and ``bytes_in_use``) on GPU and TPU; a CPU device has no memory stats,
so there ``limit`` is the host's ``MemAvailable`` (``/proc/meminfo``) with nothing in use,
measured after the weights were read, so they are counted twice there (a smaller, safe
cache). ``bytes per token`` covers all layers, K and V, in the KV dtype. The activation
reserve is an estimate (``step_activation_bytes``), not a measurement.

Everything except ``device_memory`` is pure arithmetic, tested with injected numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from local_tier.jax.gguf_loader import HParams

GIB = 1 << 30


@dataclass(frozen=True)
class DeviceMemory:
    """What one device offers: ``limit`` bytes in all, ``in_use`` already taken."""

    limit: int
    in_use: int
    source: str  # where the numbers came from, for the report


@dataclass(frozen=True)
class KvPlan:
    """The planned cache and how it was derived (``report`` is logged at start)."""

    tokens: int
    bytes_per_token: int
    detail: str

    @property
    def bytes(self) -> int:
        return self.tokens * self.bytes_per_token

    def report(self) -> str:
        return (
            f"KV cache: {self.tokens} tokens ({self.bytes / GIB:.2f} GiB, "
            f"{self.bytes_per_token / 1024:.1f} KiB per token); {self.detail}"
        )


def mem_available(meminfo: str = "/proc/meminfo") -> int | None:
    """The host's ``MemAvailable`` in bytes, or None where it cannot be read."""
    try:
        text = Path(meminfo).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    return None


def device_memory(device: Any, meminfo: str = "/proc/meminfo") -> DeviceMemory:
    """``device``'s memory from its ``memory_stats()``; for a device without them (CPU) the
    host's available memory. ValueError (naming the field) when neither is known."""
    try:
        stats = device.memory_stats()
    except Exception:  # some backends raise instead of returning None
        stats = None
    if stats and "bytes_limit" in stats:
        return DeviceMemory(
            int(stats["bytes_limit"]),
            int(stats.get("bytes_in_use", 0)),
            f"{device.platform} memory_stats",
        )
    available = mem_available(meminfo)
    if available is None:
        raise ValueError(
            f"EngineConfig.kv_cache_fraction: the memory of {device} is unknown (no "
            f"memory_stats() and no MemAvailable in {meminfo}); set kv_cache_tokens instead"
        )
    return DeviceMemory(available, 0, "host MemAvailable")


def kv_bytes_per_token(hp: HParams, itemsize: int) -> int:
    """Bytes of K and V for one token over all layers."""
    return hp.n_layers * hp.n_kv_heads * hp.head_dim * 2 * itemsize


def step_activation_bytes(
    hp: HParams, shape: tuple[int, int, int], chunk_tokens: int | None = None
) -> int:
    """An upper estimate of the live temporaries of one step of ``shape``: per new token the
    fp32 residual, norm and attention outputs (3 x d_model), Q/K/V, gate/up and the MLP
    product (3 x d_ff) and attention scores over the keys read at once + new tokens; those
    keys' K and V gathered in fp32; every row's logits. Attention reads the context
    ``chunk_tokens`` at a time (``attention.py``; None: all of it). Doubled, since XLA keeps
    more than one layer's temporaries alive at a time."""
    b, t, p = shape
    if chunk_tokens is not None:
        p = min(p, chunk_tokens)
    qkv = (hp.n_heads + 2 * hp.n_kv_heads) * hp.head_dim
    per_token = 4 * (3 * hp.d_model + qkv + 3 * hp.d_ff + hp.n_heads * (p + t))
    gathered = b * p * hp.n_kv_heads * hp.head_dim * 2 * 4
    logits = b * hp.vocab_size * 4
    return 2 * (b * t * per_token + gathered + logits)


def plan_kv_cache(
    fraction: float,
    memory: DeviceMemory,
    weight_bytes: int,
    reserve_bytes: int,
    bytes_per_token: int,
    block_size: int,
    devices: int = 1,
) -> KvPlan:
    """The KV cache ``fraction`` of ``memory`` leaves (see the module's formula), in whole
    blocks. ``weight_bytes`` are all weights (split over ``devices`` under tensor
    parallelism); ``memory`` and ``reserve_bytes`` are per device. ValueError naming
    ``kv_cache_fraction`` when it leaves room for fewer than two blocks."""
    if not 0 < fraction <= 1:
        raise ValueError(f"EngineConfig.kv_cache_fraction must be in (0, 1], got {fraction}")
    usable = int(fraction * memory.limit)
    per_device = usable - memory.in_use - weight_bytes // devices - reserve_bytes
    blocks = max(0, per_device * devices // bytes_per_token // block_size)
    detail = (
        f"{fraction:g} x {memory.limit / GIB:.2f} GiB ({memory.source}) - "
        f"{memory.in_use / GIB:.2f} GiB in use - weights {weight_bytes / GIB:.2f} GiB - "
        f"activation reserve {reserve_bytes / GIB:.2f} GiB"
        + (f", per device x {devices} devices" if devices > 1 else "")
    )
    if blocks < 2:
        raise ValueError(
            f"EngineConfig.kv_cache_fraction={fraction:g} leaves no room for the KV cache "
            f"({detail} = {per_device / GIB:.2f} GiB; two blocks need "
            f"{2 * block_size * bytes_per_token / GIB:.4f} GiB): raise it or set "
            "kv_cache_tokens"
        )
    return KvPlan(blocks * block_size, bytes_per_token, detail)


def fixed_kv_cache(tokens: int, bytes_per_token: int, block_size: int) -> KvPlan:
    """The cache ``kv_cache_tokens`` asks for, in whole blocks."""
    return KvPlan(tokens // block_size * block_size, bytes_per_token, "from kv_cache_tokens")
