"""Device selection, XLA flags and the persistent compilation cache.

Import this module before anything imports JAX: XLA reads ``XLA_FLAGS`` once, when its first
backend starts. ``--xla_cpu_copy_insertion_use_region_analysis=true`` lets XLA:CPU update the
donated KV cache in place (without it each step copied the cache 2-4 times: 95 ms -> 30 ms per
step here). ``--xla_cpu_enable_concurrency_optimized_scheduler=false`` makes XLA:CPU schedule
each layer's KV gather next to its use: the default scheduler hoisted all 60 gathers to the
start of the step, so their outputs were live together and the step's temporary buffer grew
past glibc's 32 MiB mmap limit (279 MB at batch 32, context 384); that buffer was mmapped and
page-faulted afresh on every step (68k faults, 190 ms -> 71 ms per step). A user's own
``XLA_FLAGS`` are kept, and each of these flags it does not mention is added to them (so
``XLA_FLAGS=--xla_force_host_platform_device_count=8``, 8 virtual CPU devices for tensor
parallelism tests, still gets both); a flag the user sets wins.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

CPU_FLAGS = (
    "--xla_cpu_copy_insertion_use_region_analysis=true"
    " --xla_cpu_enable_concurrency_optimized_scheduler=false"
)


def merged_xla_flags(user: str | None) -> str:
    """``user``'s XLA flags plus each of ``CPU_FLAGS`` whose name they do not mention."""
    flags = (user or "").split()
    named = {f.split("=", 1)[0] for f in flags}
    flags += [f for f in CPU_FLAGS.split() if f.split("=", 1)[0] not in named]
    return " ".join(flags)


os.environ["XLA_FLAGS"] = merged_xla_flags(os.environ.get("XLA_FLAGS"))

import jax  # noqa: E402  (must follow the XLA_FLAGS set-up above)

PREFERENCE = ("tpu", "gpu", "cpu")
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "switchyard" / "jax"


class BackendError(RuntimeError):
    """The requested backend is not available in this JAX installation."""


def select_device(backend: str = "auto") -> Any:
    """The first device of ``backend``; ``auto`` takes the best available (tpu > gpu > cpu)."""
    return select_devices(backend, 1)[0]


def select_devices(backend: str = "auto", count: int = 1) -> list[Any]:
    """The first ``count`` devices of ``backend`` (``auto``: the best platform present,
    tpu > gpu > cpu). Raises ``BackendError`` when that platform has fewer."""
    wanted = PREFERENCE if backend == "auto" else (backend,)
    errors: list[str] = []
    for platform in wanted:
        try:
            devices = jax.devices(platform)
        except RuntimeError as exc:  # JAX raises RuntimeError for an absent platform
            errors.append(f"{platform}: {exc}")
            continue
        if len(devices) >= count:
            return list(devices[:count])
        if devices:
            raise BackendError(_too_few(platform, len(devices), count))
    hint = {"tpu": "pip install 'jax[tpu]'", "gpu": "pip install 'jax[cuda12]'"}.get(backend, "")
    raise BackendError(
        f"No JAX device for backend {backend!r}"
        + (f" (install it with `{hint}`)" if hint else "")
        + (f": {'; '.join(errors)}" if errors else "")
    )


def _too_few(platform: str, have: int, count: int) -> str:
    hint = (
        " (XLA_FLAGS=--xla_force_host_platform_device_count=N makes N virtual CPU devices)"
        if platform == "cpu"
        else ""
    )
    return (
        f"{count} {platform} devices wanted (EngineConfig.tensor_parallel x data_parallel), "
        f"but JAX sees {have}{hint}"
    )


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bf16 natively (x86 AVX512-BF16 or AMX-BF16, read from
    Linux's ``/proc/cpuinfo``; False where that file is absent)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return False
    flags = set(text.split())
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def enable_compile_cache(directory: str | None) -> Path | None:
    """Turn on JAX's persistent compilation cache (None = default dir, "" = off) so that a
    restarted engine loads its compiled steps instead of recompiling them."""
    if directory == "":
        return None
    path = Path(directory).expanduser() if directory else DEFAULT_CACHE_DIR
    path.mkdir(parents=True, exist_ok=True)
    config: Any = jax.config
    config.update("jax_compilation_cache_dir", str(path))
    config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
