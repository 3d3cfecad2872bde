"""The ``workers:`` section: local-tier worker processes that ``switchyard serve`` starts,
keeps alive and stops itself (docs/workers.md).

Each entry (keyed by its name) runs ``replicas`` processes of one engine, each on a port of
its ``port_range`` on 127.0.0.1 and on its own group of ``devices``, and serves them as the
replicas of the ``type: vllm`` provider it names. That provider's settings (timeouts,
``saturation``, ``block_size``, ``local``) apply to every replica; its ``base_url`` and
``metrics_url`` are not used (each replica is reached at its own port). Several entries may
name the same provider: their replicas pool together.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

PositiveFloat = Annotated[float, Meta(gt=0)]
PositiveInt = Annotated[int, Meta(ge=1)]
Port = Annotated[int, Meta(ge=1, le=65535)]
PORT_PLACEHOLDER = "{port}"
# A TPU worker's libtpu mesh controller listens on its HTTP port plus this (one per process).
TPU_MESH_PORT_OFFSET = 10_000
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEVICE = re.compile(r"^[A-Za-z0-9_-]+$")  # an index ("0") or a GPU UUID ("GPU-5f3c...")

Engine = Literal["jax", "vllm", "command"]
Accelerator = Literal["gpu", "tpu"]
ReplaceOrder = Literal["start_first", "stop_first"]


class RestartBackoff(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The wait before restarting a worker that exited or failed to start: ``initial_s``,
    doubled after each further failure, at most ``max_s``. A worker that stayed ready for
    ``max_s`` starts again from ``initial_s`` after its next failure."""

    initial_s: PositiveFloat = 1.0
    max_s: PositiveFloat = 60.0

    def __post_init__(self) -> None:
        if self.max_s < self.initial_s:
            raise ValueError(f"backoff.max_s ({self.max_s}) is below initial_s")


class WorkerConfig(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One entry of ``workers:``.

    - ``engine``: ``vllm`` (``vllm serve MODEL``), ``jax`` (``switchyard worker jax``, i.e.
      ``python -m local_tier.worker``) or ``command`` (any OpenAI-compatible server with
      vLLM's ``/health`` and ``/metrics``: ``command`` is its argv, in which ``{port}``
      stands for the port it must listen on, on 127.0.0.1).
    - ``provider``: the ``type: vllm`` provider whose replicas these processes are.
    - ``model``: vllm: the model (path or Hugging Face id, required); jax: a GGUF file
      (default: the bundled SmolLM2-135M); command: not used (``{model}`` in ``command``).
    - ``served_model_name``: the name targets use (``models.*.targets[].model``); default:
      the engine's (vLLM: ``model``; jax: ``smollm2-135m-instruct``).
    - ``replicas``: processes of this entry.
    - ``devices``: one device group per replica (``["0", "1"]``, or ``["0,1", "2,3"]``
      with ``tensor_parallel: 2``), exported as ``CUDA_VISIBLE_DEVICES`` (``accelerator:
      gpu``) or ``TPU_VISIBLE_CHIPS`` and its bounds (``accelerator: tpu``). Empty: the
      processes inherit the gateway's devices.
    - ``tensor_parallel``: devices per replica, the model split over them (vLLM's
      ``--tensor-parallel-size``; the JAX worker's ``--tensor-parallel``, which must divide
      the model's KV heads: SmolLM2-135M takes 1 or 3). More copies of a model: ``replicas``.
    - ``port_range``: ``[first, last]`` ports the replicas may listen on; it needs one more
      port than ``replicas`` with ``replace: start_first`` (a replacement starts before the
      process it replaces stops).
    - ``executable``: vllm: the ``vllm`` program (default ``vllm`` on the PATH); jax: the
      Python that runs the worker (default: the gateway's own).
    - ``args``: extra flags appended to the engine's argv; ``env``: extra environment.
    - ``log_dir``: where each process writes its output (``<name>-<replica>.log``,
      appended; relative to the policy file's folder); none: discarded.
    - ``start_timeout_s``: how long a process may take to answer ``/health`` with 200 (a
      vLLM loading a large model: minutes); after it, it counts as failed and is restarted.
    - ``health_interval_s``, ``unhealthy_after``: once ready, ``/health`` is asked every
      ``health_interval_s``; a process whose ``/health`` fails (not 200, or no answer in
      that interval) ``unhealthy_after`` times in a row counts as failed (a hung engine does
      not exit): its group is stopped and it is restarted.
    - ``backoff``: the restart schedule (``RestartBackoff``).
    - ``drain_timeout_s``: how long a process that is being stopped may keep requests
      running or waiting (its ``/metrics``) after it left the routing table.
    - ``stop_timeout_s``: after SIGTERM to its process group, the wait before SIGKILL.
    - ``replace``: how a changed entry replaces its processes, one replica at a time:
      ``start_first`` (the new process is ready before the old one drains) or
      ``stop_first`` (the old one drains and stops first: for devices one process holds
      alone, such as TPU chips or a GPU that vLLM fills). Default: ``stop_first`` for
      ``accelerator: tpu``, else ``start_first``.
    """

    engine: Engine
    provider: Annotated[str, Meta(min_length=1)]
    model: str | None = None
    served_model_name: str | None = None
    command: list[str] = []
    replicas: PositiveInt = 1
    devices: list[str] = []
    accelerator: Accelerator = "gpu"
    tensor_parallel: PositiveInt = 1
    port_range: tuple[Port, Port] = (8100, 8199)
    executable: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    log_dir: str | None = None
    start_timeout_s: PositiveFloat = 600.0
    health_interval_s: PositiveFloat = 5.0
    unhealthy_after: PositiveInt = 3
    backoff: RestartBackoff = RestartBackoff()
    drain_timeout_s: PositiveFloat = 60.0
    stop_timeout_s: PositiveFloat = 15.0
    replace: ReplaceOrder | None = None

    def __post_init__(self) -> None:
        problem = self._engine_problem() or self._ports_problem() or self._devices_problem()
        problem = problem or _env_problem(self.env)
        if problem:
            raise ValueError(problem)

    @property
    def replace_order(self) -> ReplaceOrder:
        if self.replace is not None:
            return self.replace
        return "stop_first" if self.accelerator == "tpu" else "start_first"

    @property
    def ports(self) -> range:
        return range(self.port_range[0], self.port_range[1] + 1)

    def device_group(self, replica: int) -> list[str]:
        """The devices of replica ``replica`` (none when ``devices`` is empty)."""
        if not self.devices:
            return []
        return [d.strip() for d in self.devices[replica].split(",")]

    def _command_problem(self) -> str | None:
        if self.engine != "command":
            return f"`command` is for engine command only (engine is {self.engine})"
        if not self.command:
            return "engine command needs `command` (the server's argv, with {port})"
        if not any(PORT_PLACEHOLDER in part for part in self.command):
            return "`command` must contain {port} (where the server's port goes)"
        if self.executable is not None:
            return "`executable`: engine command takes its program from `command`"
        return None

    def _engine_problem(self) -> str | None:
        if self.engine == "command" or self.command:
            problem = self._command_problem()
            if problem:
                return problem
        if self.engine == "vllm" and not self.model:
            return "engine vllm needs `model` (a path or a Hugging Face model id)"
        if self.accelerator == "tpu" and self.replace == "start_first":
            return "accelerator tpu: a chip serves one process, so replace must be stop_first"
        return None

    def _ports_problem(self) -> str | None:
        first, last = self.port_range
        if last < first:
            return f"port_range [{first}, {last}]: the last port is below the first"
        if self.accelerator == "tpu" and self.devices and last + TPU_MESH_PORT_OFFSET > 65535:
            return (
                f"port_range [{first}, {last}]: with accelerator tpu each worker also uses its"
                f" port + {TPU_MESH_PORT_OFFSET} (libtpu's mesh controller): keep it below"
                f" {65536 - TPU_MESH_PORT_OFFSET}"
            )
        needed = self.replicas + (1 if self.replace_order == "start_first" else 0)
        if len(self.ports) < needed:
            why = " (one spare for replace: start_first)" if needed > self.replicas else ""
            size = len(self.ports)
            return f"port_range [{first}, {last}] holds {size} ports; {needed} needed{why}"
        return None

    def _devices_problem(self) -> str | None:
        if not self.devices:
            return None
        if len(self.devices) != self.replicas:
            return (
                f"devices lists {len(self.devices)} groups for {self.replicas} replicas "
                "(one group per replica, e.g. ['0', '1'])"
            )
        for index in range(self.replicas):
            group = self.device_group(index)
            if not all(_DEVICE.match(device) for device in group):
                return f"devices[{index}] '{self.devices[index]}' is not a comma-separated list"
            if len(set(group)) != len(group):
                return f"devices[{index}] '{self.devices[index]}' names a device twice"
            if self.accelerator == "gpu" and len(group) != self.tensor_parallel:
                return (
                    f"devices[{index}] has {len(group)} devices for tensor_parallel "
                    f"{self.tensor_parallel}"
                )
        return None


def _env_problem(env: Mapping[str, str]) -> str | None:
    for name in env:
        if not _ENV_NAME.match(name):
            return f"env: '{name}' is not an environment variable name"
    return None


def worker_problems(
    workers: Mapping[str, WorkerConfig],
    provider_types: Mapping[str, Any],
) -> list[str]:
    """Problems across entries and providers, each led by its key path.

    ``provider_types`` maps each configured provider's name to its decoded config (or to
    anything, when it could not be decoded: its own error is reported already). A worker
    must name a provider that exists, is ``type: vllm`` and is not discovered by DNS; two
    entries must not share ports."""
    problems: list[str] = []
    for name, worker in workers.items():
        where = f"workers.{name}.provider"
        if worker.provider not in provider_types:
            problems.append(f"{where}: unknown provider '{worker.provider}'")
            continue
        provider = provider_types[worker.provider]
        kind = getattr(provider, "__struct_config__", None)
        tag = kind.tag if kind is not None else None
        if tag is not None and tag != "vllm":
            problems.append(
                f"{where}: provider '{worker.provider}' is type {tag}; workers serve as the "
                "replicas of a `type: vllm` provider"
            )
        elif getattr(provider, "discovery", None) is not None:
            problems.append(
                f"{where}: provider '{worker.provider}' finds its replicas by DNS (discovery);"
                " a provider is either discovered or served by workers"
            )
    problems.extend(_overlapping_ports(workers))
    return problems


def _overlapping_ports(workers: Mapping[str, WorkerConfig]) -> list[str]:
    problems = []
    entries = list(workers.items())
    for position, (name, worker) in enumerate(entries):
        for other, earlier in entries[:position]:
            first, last = worker.port_range
            if first <= earlier.port_range[1] and earlier.port_range[0] <= last:
                problems.append(
                    f"workers.{name}.port_range: overlaps workers.{other}.port_range "
                    "(each entry needs its own ports)"
                )
    return problems


def managed_providers(workers: Mapping[str, WorkerConfig]) -> set[str]:
    """The providers whose replicas are worker processes."""
    return {worker.provider for worker in workers.values()}
