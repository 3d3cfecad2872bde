"""Shared by the ``workers:`` tests: loopback port ranges nobody holds, the fake worker's
command (tests/fixtures/fake_worker.py), and whether a process (group) is gone."""

from __future__ import annotations

import random
import socket
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

FAKE_WORKER = Path(__file__).resolve().parents[1] / "fixtures" / "fake_worker.py"


def free_range(size: int) -> tuple[int, int]:
    """``size`` consecutive ports free on 127.0.0.1 now (held together while checked)."""
    for _ in range(200):
        first = random.randrange(20_000, 40_000)
        with ExitStack() as held:
            try:
                for port in range(first, first + size):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return first, first + size - 1
    raise RuntimeError("no free port range")


def fake_worker(name: str, *extra: str) -> list[str]:
    """The argv of a fake worker named ``name`` (``{port}`` left for the supervisor)."""
    return [sys.executable, str(FAKE_WORKER), "--port", "{port}", "--name", name, *extra]


def command_entry(name: str, provider: str, ports: tuple[int, int], *extra: str) -> str:
    """A YAML flow mapping for a ``workers:`` entry running the fake worker."""
    argv = ", ".join(f'"{part}"' for part in fake_worker(name, *extra))
    return (
        f"{{engine: command, provider: {provider}, command: [{argv}], "
        f"port_range: [{ports[0]}, {ports[1]}], start_timeout_s: 30, "
        "backoff: {initial_s: 0.2, max_s: 1.0}, drain_timeout_s: 10, stop_timeout_s: 5}"
    )


def process_gone(pid: int) -> bool:
    """No live process ``pid`` (exited and reaped, or a zombie of someone else's)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def group_gone(pgid: int) -> bool:
    """No live process is left in process group ``pgid``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return False
    return True


def wait_for(condition: Callable[[], bool], limit_s: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.05)
