"""Gateways as real OS processes (``python -m gateway.cli serve``), for tests that need
several replicas, a SIGTERM, or a kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.fixtures.server import free_port

ROOT = Path(__file__).resolve().parents[2]


class GatewayProcess:
    """One gateway process serving ``config_path`` on a free loopback port; its output goes
    to ``log_path`` (read it when a test fails)."""

    def __init__(self, config_path: Path, env: dict[str, str], log_path: Path) -> None:
        self.config_path = config_path
        self.env = env
        self.log_path = log_path
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def start(self, timeout_s: float = 60.0) -> GatewayProcess:
        command = [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--config",
            str(self.config_path),
            "--port",
            str(self.port),
        ]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited early:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"gateway did not start:\n{self.log_path.read_text()[-3000:]}")

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (graceful: drains in-flight requests) and wait for the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
