"""What a worker replica runs (argv and environment per engine) and what a reload does to
the running replicas (start / keep / replace / stop per slot)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from core.config_workers import WorkerConfig
from local_tier.workers.launch import engine_argv, launch_spec, pick_port
from local_tier.workers.plan import plan, slot_specs

PY = "/opt/py/bin/python"


def worker(**fields: object) -> WorkerConfig:
    return msgspec.convert({"provider": "pool", **fields}, WorkerConfig)


def test_vllm_argv_is_vllm_serve_on_loopback_with_the_entry_flags_last() -> None:
    config = worker(
        engine="vllm",
        model="meta-llama/Llama-3.1-8B-Instruct",
        served_model_name="llama",
        tensor_parallel=2,
        devices=["0,1"],
        args=["--max-num-seqs", "64", "--port", "1"],
    )
    assert engine_argv(config, PY) == [
        "vllm",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--served-model-name",
        "llama",
        "--tensor-parallel-size",
        "2",
        "--max-num-seqs",
        "64",
        "--port",
        "1",
    ]
    spec = launch_spec("gpu", config, 0, python=PY, base_dir=None)
    assert spec.argv_for(8101)[6] == "8101"
    assert spec.env_for(8101, {"PATH": "/bin"}) == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1"}


def test_vllm_uses_the_named_executable() -> None:
    config = worker(engine="vllm", model="m", executable="/opt/vllm/bin/vllm")
    assert engine_argv(config, PY)[:3] == ["/opt/vllm/bin/vllm", "serve", "m"]


def test_jax_argv_is_the_switchyard_worker_module() -> None:
    assert engine_argv(worker(engine="jax"), PY) == [
        PY,
        "-m",
        "local_tier.worker",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
    ]
    tpu = worker(
        engine="jax",
        model="/m/q.gguf",
        served_model_name="small",
        accelerator="tpu",
        replicas=2,
        devices=["0", "1"],
        port_range=[8100, 8101],
    )
    assert engine_argv(tpu, PY)[7:] == [
        "--model",
        "/m/q.gguf",
        "--served-model-name",
        "small",
        "--backend",
        "tpu",
    ]
    env = launch_spec("tpu", tpu, 1, python=PY, base_dir=None).env_for(8101, {})
    assert env == {
        "TPU_VISIBLE_CHIPS": "1",
        "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_MESH_CONTROLLER_PORT": "18101",
        "TPU_MESH_CONTROLLER_ADDRESS": "localhost:18101",
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
    }


def test_command_argv_is_the_command_with_port_filled_and_braces_kept() -> None:
    config = worker(
        engine="command",
        command=["srv", "--port={port}", '{"a": 1}'],
        args=["-v"],
        env={"X": "at {port}"},
    )
    spec = launch_spec("c", config, 0, python=PY, base_dir=None)
    assert spec.argv_for(9000) == ["srv", "--port=9000", '{"a": 1}', "-v"]
    assert spec.env_for(9000, {}) == {"X": "at 9000"}


def test_a_relative_log_dir_starts_at_the_policy_file() -> None:
    config = worker(engine="jax", log_dir="logs", replicas=2, port_range=[9000, 9002])
    spec = launch_spec("w", config, 1, python=PY, base_dir=Path("/etc/sy"))
    assert spec.log_path == "/etc/sy/logs/w-1.log"
    assert launch_spec("w", worker(engine="jax"), 0, python=PY, base_dir=None).log_path is None


def test_pick_port_skips_ours_and_busy_ones() -> None:
    busy = {9001}
    assert pick_port(range(9000, 9004), {9000}, lambda p: p not in busy) == 9002
    assert pick_port(range(9000, 9002), {9000}, lambda p: p not in busy) is None


def test_the_plan_keeps_unchanged_slots_and_replaces_changed_ones() -> None:
    a = worker(engine="command", command=["a", "{port}"], port_range=[9000, 9001])
    b = worker(engine="command", command=["b", "{port}"], port_range=[9010, 9011])
    old = slot_specs({"a": a, "b": b}, python=PY, base_dir=None)
    b2 = msgspec.structs.replace(b, args=["--tag", "v2"])
    moves = plan(old, slot_specs({"a": a, "b": b2}, python=PY, base_dir=None))
    assert (moves.keep, moves.replace, moves.start, moves.stop) == ([("a", 0)], [("b", 0)], [], [])
    assert not moves.unchanged


def test_settings_that_do_not_change_the_process_keep_it() -> None:
    a = worker(engine="command", command=["a", "{port}"], port_range=[9000, 9001])
    slower = msgspec.structs.replace(a, start_timeout_s=5.0, drain_timeout_s=1.0)
    moves = plan(
        slot_specs({"a": a}, python=PY, base_dir=None),
        slot_specs({"a": slower}, python=PY, base_dir=None),
    )
    assert moves.keep == [("a", 0)]
    assert moves.unchanged


def test_scaling_starts_and_stops_only_the_slots_that_differ() -> None:
    two = worker(engine="jax", replicas=2, devices=["0", "1"], port_range=[9000, 9009])
    three = msgspec.structs.replace(two, replicas=3, devices=["0", "1", "2"])
    up = plan(
        slot_specs({"w": two}, python=PY, base_dir=None),
        slot_specs({"w": three}, python=PY, base_dir=None),
    )
    assert (up.keep, up.start) == ([("w", 0), ("w", 1)], [("w", 2)])
    gone = plan(slot_specs({"w": three}, python=PY, base_dir=None), {})
    assert gone.stop == [("w", 0), ("w", 1), ("w", 2)]
    moved = msgspec.structs.replace(two, devices=["1", "0"])
    swapped = plan(
        slot_specs({"w": two}, python=PY, base_dir=None),
        slot_specs({"w": moved}, python=PY, base_dir=None),
    )
    assert swapped.replace == [("w", 0), ("w", 1)]
