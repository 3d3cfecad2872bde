"""Gateway processes for the benchmark: the generated policy file and ``switchyard serve``.

Contract: ``gateway_config`` writes one alias ``chat`` over the four upstreams in the
priority order (premium, mid, budget, local) with the menu's prices and the given
strategy (``slo_hedged``: ``slo`` with ``hedge_share``) and an admin key (the health
timeline); every timeout, retry and breaker setting is the gateway's default. With feed
``metrics`` the local box is a ``type: vllm`` provider (its ``/metrics`` polled), else a plain
``type: openai`` one. State is in memory; the ledger goes to the run's temporary folder.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.routing_e2e.health import ADMIN_KEY, ADMIN_KEY_ENV
from bench.routing_e2e.menu import MENU, ORDER

ROOT = Path(__file__).resolve().parents[2]
WEIGHTS = {"premium": 1.0, "mid": 2.0, "budget": 2.0, "local": 1.0}
ALIAS = "chat"
HEDGE_SHARE = 0.1  # slo_hedged: hedges at most 10% of requests (+1 per 30 s)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gateway_config(policy: str, urls: dict[str, str], feed: str, ledger: Path) -> dict[str, Any]:
    """The policy file (as a mapping) for one policy run; ``urls`` by upstream name."""
    providers: dict[str, Any] = {}
    targets = []
    for name in ORDER:
        spec = MENU[name]
        kind = "vllm" if spec.slots and feed == "metrics" else "openai"
        providers[name] = {"type": kind, "base_url": urls[name] + "/v1"}
        target: dict[str, Any] = {
            "provider": name,
            "model": f"{name}-model",
            "price": {
                "input_per_mtok": spec.input_per_mtok,
                "output_per_mtok": spec.output_per_mtok,
            },
        }
        if policy == "weighted":
            target["weight"] = WEIGHTS[name]
        targets.append(target)
    return {
        "server": {"watch_config": False},
        "state": {"backend": "memory"},
        "ledger": {"path": str(ledger)},
        "auth": {"admin_key_env": ADMIN_KEY_ENV},  # the health timeline reads /admin/targets
        "logging": {"level": "warning", "json": True},
        "providers": providers,
        "models": {ALIAS: {"strategy": strategy(policy), "targets": targets}},
    }


def strategy(policy: str) -> str | dict[str, Any]:
    """The alias's strategy for ``policy``: its name, or ``slo_hedged``: ``slo`` with
    hedging on (``hedge_share`` ``HEDGE_SHARE``)."""
    if policy == "slo_hedged":
        return {"type": "slo", "hedge_share": HEDGE_SHARE}
    return policy


def to_yaml(config: dict[str, Any]) -> str:
    """YAML via JSON (a JSON document is valid YAML): no extra dependency, exact values."""
    import json

    return json.dumps(config, indent=2) + "\n"


class Gateway:
    """One ``switchyard serve`` process on a free port; output to ``log_path``."""

    def __init__(self, config_path: Path, log_path: Path) -> None:
        self.config_path, self.log_path = config_path, log_path
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self) -> None:
        exe = Path(sys.executable).with_name("switchyard")
        command = [str(exe), "serve", "--config", str(self.config_path)]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        env = {**os.environ, ADMIN_KEY_ENV: ADMIN_KEY}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until ``/readyz`` answers 200; RuntimeError with the log's tail otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited early:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"gateway not ready:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
