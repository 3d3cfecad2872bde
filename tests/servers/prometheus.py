"""A real Prometheus server (Debian's ``prometheus``) on a free loopback port, for tests,
and a small client for its HTTP API (``/api/v1``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from tests.fixtures.server import free_port

T = TypeVar("T")
MISSING = [tool for tool in ("prometheus", "promtool") if shutil.which(tool) is None]
needs_prometheus = pytest.mark.skipif(
    bool(MISSING),
    reason=f"{' and '.join(MISSING)} not on PATH (scripts/setup_servers.sh installs Debian's "
    "prometheus package; `make test-servers` runs it)",
)


def wait_for(what: str, check: Callable[[], T | None], timeout_s: float = 30.0) -> T:
    """Poll ``check`` every 0.2 s until it returns something other than None (returned);
    fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


class Prometheus:
    """``prometheus`` scraping ``jobs`` (job name -> ``host:port`` targets) every second and
    evaluating ``rule_files`` every second; data and log live in ``folder``. Stopped by
    its PID (SIGTERM, then SIGKILL)."""

    def __init__(self, folder: Path, jobs: dict[str, list[str]], rule_files: list[Path]) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = folder / "prometheus.log"
        self.config_path = folder / "prometheus.yml"
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": targets}]}
                for job, targets in jobs.items()
            ],
        }
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> Prometheus:
        command = [
            "prometheus",
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        wait_for("Prometheus to be ready", self._ready, timeout_s)
        return self

    def _ready(self) -> bool | None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"prometheus exited {self.proc.returncode}:\n{self.log()}")
        try:
            return True if httpx.get(self.url + "/-/ready", timeout=1).status_code == 200 else None
        except httpx.TransportError:
            return None

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def log(self) -> str:
        return self.log_path.read_text()[-3000:] if self.log_path.exists() else ""

    # ------------------------------------------------------------------ HTTP API
    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``'s ``data``; fails the test on an error status."""
        answer = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = answer.json()
        assert answer.status_code == 200 and body["status"] == "success", (path, params, body)
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's vector: ``[{"metric": {...}, "value": [ts, "v"]}, ...]``."""
        data = self.api("query", query=promql)
        assert data["resultType"] == "vector", (promql, data)
        return list(data["result"])

    def values(self, promql: str, *labels: str) -> dict[tuple[str, ...], float]:
        """An instant query's samples keyed by the values of ``labels``."""
        return {
            tuple(sample["metric"].get(label, "") for label in labels): float(sample["value"][1])
            for sample in self.query(promql)
        }

    def scalar(self, promql: str) -> float | None:
        """The value of a query that yields at most one sample (None: no sample)."""
        samples = self.query(promql)
        assert len(samples) <= 1, (promql, samples)
        return float(samples[0]["value"][1]) if samples else None
