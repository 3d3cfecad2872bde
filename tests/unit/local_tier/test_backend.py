"""Device-independent parts of ``local_tier.jax.backend`` and the dtype choices built on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from local_tier.jax import backend
from local_tier.jax.api import EngineConfig
from local_tier.jax.setup import prefill_dtype

ZEN4 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
ZEN3 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n"


@pytest.mark.parametrize(("text", "native"), [(ZEN4, True), (ZEN3, False)])
def test_native_bf16_is_read_from_the_cpu_flags(tmp_path: Path, text: str, native: bool) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(text)
    assert backend.cpu_has_native_bf16(str(info)) is native


def test_no_cpuinfo_means_no_native_bf16(tmp_path: Path) -> None:
    assert backend.cpu_has_native_bf16(str(tmp_path / "absent")) is False


@pytest.mark.parametrize(
    ("native", "platform", "configured", "expected"),
    [
        (False, "cpu", None, "float32"),  # conversion-bound bf16 prefill: keep an fp32 copy
        (True, "cpu", None, "bfloat16"),  # native bf16: the decode weights serve prefill too
        (False, "gpu", None, "bfloat16"),
        (False, "cpu", "bfloat16", "bfloat16"),  # an explicit choice wins
    ],
)
def test_prefill_weights_follow_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
    native: bool,
    platform: str,
    configured: str | None,
    expected: str,
) -> None:
    monkeypatch.setattr(backend, "cpu_has_native_bf16", lambda: native)
    config = EngineConfig(dtype="bfloat16", prefill_dtype=configured)  # type: ignore[arg-type]
    assert prefill_dtype(config, platform) == expected


def test_cpu_flags_keep_the_in_place_cache_and_the_memory_bound_scheduler() -> None:
    assert "--xla_cpu_copy_insertion_use_region_analysis=true" in backend.CPU_FLAGS
    assert "--xla_cpu_enable_concurrency_optimized_scheduler=false" in backend.CPU_FLAGS
