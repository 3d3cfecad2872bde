"""A JAX worker split over several devices: the entry is accepted, the worker is told its
split, and its flags reach the provider config."""

from __future__ import annotations

import msgspec
import pytest

from core.config_workers import WorkerConfig
from local_tier.provider import engine_config
from local_tier.worker.cli import build_parser, config_from_args
from local_tier.workers.launch import launch_spec

PY = "/opt/py/bin/python"


def test_a_jax_entry_may_split_each_replica_over_its_devices() -> None:
    config = msgspec.convert(
        {
            "engine": "jax",
            "provider": "pool",
            "tensor_parallel": 2,
            "replicas": 2,
            "devices": ["0,1", "2,3"],
        },
        WorkerConfig,
    )
    spec = launch_spec("tp", config, 1, python=PY, base_dir=None)
    argv = spec.argv_for(8100)
    assert argv[argv.index("--tensor-parallel") + 1] == "2"
    assert argv[argv.index("--backend") + 1] == "gpu"
    assert spec.env_for(8100, {}) == {"CUDA_VISIBLE_DEVICES": "2,3"}


def test_one_device_adds_no_flag() -> None:
    config = msgspec.convert({"engine": "jax", "provider": "pool"}, WorkerConfig)
    assert "--tensor-parallel" not in launch_spec("one", config, 0, python=PY, base_dir=None).argv


@pytest.mark.parametrize(
    ("flags", "tp", "dp"),
    [
        ([], 1, 1),
        (["--tensor-parallel", "3"], 3, 1),
        (["--tensor-parallel-size", "2", "--data-parallel-size", "4"], 2, 4),
        (["-tp", "4", "-dp", "2"], 4, 2),
    ],
)
def test_worker_flags_reach_the_engine_config(flags: list[str], tp: int, dp: int) -> None:
    provider = config_from_args(build_parser().parse_args(flags))
    engine = engine_config(provider)
    assert (engine.tensor_parallel, engine.data_parallel) == (tp, dp)


def test_worker_refuses_a_zero_split() -> None:
    with pytest.raises(msgspec.ValidationError, match="tensor_parallel"):
        config_from_args(build_parser().parse_args(["--tensor-parallel", "0"]))


def test_memory_share_and_attention_flags_reach_the_engine_config() -> None:
    flags = ["--gpu-memory-utilization", "0.9", "--attention", "pallas"]
    engine = engine_config(config_from_args(build_parser().parse_args(flags)))
    assert (engine.kv_cache_fraction, engine.attention) == (0.9, "pallas")
    plain = engine_config(config_from_args(build_parser().parse_args([])))
    assert (plain.kv_cache_fraction, plain.attention) == (None, "auto")
    with pytest.raises(ValueError, match="kv_cache_fraction"):
        config_from_args(build_parser().parse_args(["--kv-cache-fraction", "1.5"]))
