"""What one worker replica runs: its argv, environment and log file, per engine (pure).

``launch_spec(name, config, replica, ...)`` -> ``LaunchSpec``. The port is not in it: a
replica gets a free port of its entry's range each time it starts (a replacement runs next
to the process it replaces), so the argv and environment hold ``{port}`` and
``LaunchSpec.argv_for(port)`` / ``env_for(port)`` fill it in. Two specs compare equal
exactly when the processes they start would be the same: that is what a reload compares.

- vllm: ``vllm serve MODEL --host 127.0.0.1 --port {port}`` (+ ``--served-model-name``,
  ``--tensor-parallel-size``), as ``local_tier/vllm/process.py``'s ``VllmSettings`` runs it.
- jax: ``python -m local_tier.worker --host 127.0.0.1 --port {port}`` (what
  ``switchyard worker jax`` runs; + ``--model``, ``--served-model-name``, ``--backend``,
  ``--tensor-parallel``).
- command: the entry's ``command`` as written.

``args`` follow the engine's own flags, so a flag given there wins (argparse and vLLM take
the last occurrence).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from core.config_workers import PORT_PLACEHOLDER, TPU_MESH_PORT_OFFSET, WorkerConfig

LOOPBACK = "127.0.0.1"
# TPU chips per process -> libtpu's per-process bounds (x,y,z) for processes on one host
# that do not talk to each other (one model server per chip group).
_TPU_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}
# libtpu's mesh controller needs a port of its own per process (its default, 8476, would
# be shared): the worker's port plus TPU_MESH_PORT_OFFSET.
MESH_PORT_PLACEHOLDER = "{mesh_port}"


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything that decides what a replica process is (argv and env hold ``{port}``)."""

    engine: str
    provider: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # added to the gateway's environment, in this order
    devices: tuple[str, ...]
    log_path: str | None

    def argv_for(self, port: int) -> list[str]:
        return [_fill(part, port) for part in self.argv]

    def env_for(self, port: int, base: dict[str, str]) -> dict[str, str]:
        """``base`` (the gateway's environment) plus the spec's variables."""
        env = dict(base)
        env.update((name, _fill(value, port)) for name, value in self.env)
        return env


def _fill(text: str, port: int) -> str:
    # Not str.format: flags may hold braces of their own (JSON in vLLM's --override-*).
    text = text.replace(MESH_PORT_PLACEHOLDER, str(port + TPU_MESH_PORT_OFFSET))
    return text.replace(PORT_PLACEHOLDER, str(port))


def engine_argv(config: WorkerConfig, python: str) -> list[str]:
    """The engine's argv with ``{port}``, then the entry's ``args``."""
    if config.engine == "command":
        return [*config.command, *config.args]
    if config.engine == "vllm":
        argv = [config.executable or "vllm", "serve", str(config.model)]
        argv += ["--host", LOOPBACK, "--port", PORT_PLACEHOLDER]
        if config.served_model_name:
            argv += ["--served-model-name", config.served_model_name]
        if config.tensor_parallel > 1:
            argv += ["--tensor-parallel-size", str(config.tensor_parallel)]
        return [*argv, *config.args]
    argv = [config.executable or python, "-m", "local_tier.worker"]
    argv += ["--host", LOOPBACK, "--port", PORT_PLACEHOLDER]
    if config.model:
        argv += ["--model", config.model]
    if config.served_model_name:
        argv += ["--served-model-name", config.served_model_name]
    if config.devices:
        argv += ["--backend", config.accelerator]
    if config.tensor_parallel > 1:
        argv += ["--tensor-parallel", str(config.tensor_parallel)]
    return [*argv, *config.args]


def device_env(config: WorkerConfig, devices: list[str]) -> list[tuple[str, str]]:
    """The variables that confine one replica to ``devices`` (none when it has none)."""
    if not devices:
        return []
    joined = ",".join(devices)
    if config.accelerator == "gpu":
        return [("CUDA_VISIBLE_DEVICES", joined)]
    env = [
        ("TPU_VISIBLE_CHIPS", joined),
        ("TPU_PROCESS_BOUNDS", "1,1,1"),
        ("TPU_MESH_CONTROLLER_PORT", MESH_PORT_PLACEHOLDER),
        ("TPU_MESH_CONTROLLER_ADDRESS", f"localhost:{MESH_PORT_PLACEHOLDER}"),
    ]
    bounds = _TPU_BOUNDS.get(len(devices))
    if bounds is not None:
        env.append(("TPU_CHIPS_PER_PROCESS_BOUNDS", bounds))
    return env


def launch_spec(
    name: str, config: WorkerConfig, replica: int, *, python: str, base_dir: Path | None
) -> LaunchSpec:
    """Replica ``replica`` of entry ``name``. ``python``: the interpreter for engine jax
    when the entry names none; ``base_dir``: where a relative ``log_dir`` starts (the
    policy file's folder; None: the working directory)."""
    devices = config.device_group(replica)
    env = [*device_env(config, devices), *config.env.items()]
    log_path = None
    if config.log_dir is not None:
        folder = Path(config.log_dir)
        if not folder.is_absolute() and base_dir is not None:
            folder = base_dir / folder
        log_path = str(folder / f"{name}-{replica}.log")
    return LaunchSpec(
        engine=config.engine,
        provider=config.provider,
        argv=tuple(engine_argv(config, python)),
        env=tuple(env),
        devices=tuple(devices),
        log_path=log_path,
    )


def pick_port(ports: Iterable[int], taken: set[int], is_free: Callable[[int], bool]) -> int | None:
    """The first port of ``ports`` that none of our processes holds (``taken``) and that
    ``is_free`` finds bindable now; None when there is none."""
    for port in ports:
        if port not in taken and is_free(port):
            return port
    return None
