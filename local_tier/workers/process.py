"""One worker process group as the supervisor needs it, on ``local_tier/vllm/process.py``'s
``WorkerProcess`` (own session and process group; ``stop`` = SIGTERM to the group, SIGKILL
after the grace, wait until the group is empty; only a group this object created).

Added here: the leader's exit code without blocking, a parent-death signal (Linux: a gateway
killed with SIGKILL leaves no orphaned worker behind; its own children are the engine's
business, vLLM watches its parent), and the async probes the event loop uses: ``/health``
and "is anything running or waiting" from ``/metrics``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import socket
import subprocess
import sys
from typing import Any

import httpx

from local_tier.vllm.metrics import MetricsError, afetch_metrics
from local_tier.vllm.process import WorkerProcess

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()  # loaded before any fork: the child only calls into it


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: SIGTERM when the thread that forked it ends; and exit
    at once if the parent is already gone (it died between fork and here)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


class ManagedProcess(WorkerProcess):
    """A ``WorkerProcess`` that dies with the gateway and reports its exit code.

    Start it from the event loop's thread: the parent-death signal follows the thread
    that forked the child, not the process."""

    def _spawn(self, out: int, **options: Any) -> subprocess.Popen[bytes]:
        parent = os.getpid()
        # Only a system call and os._exit run in the child before exec: none of the locks
        # other threads may hold at fork time is needed there.
        return super()._spawn(
            out, preexec_fn=functools.partial(_die_with_parent, parent), **options
        )

    def exit_code(self) -> int | None:
        """The leader's exit status (negative: the signal that ended it); None while it
        runs or before it started."""
        return None if self._proc is None else self._proc.poll()


def port_is_free(port: int) -> bool:
    """Whether a listener could bind ``127.0.0.1:port`` now. With SO_REUSEADDR, as servers
    (uvicorn, vLLM, http.server) bind: connections of a process that died, left in
    TIME_WAIT, do not keep its port from its successor."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def healthy(client: httpx.AsyncClient, base_url: str, timeout_s: float = 2.0) -> bool:
    """``GET /health`` answered 200."""
    with contextlib.suppress(httpx.HTTPError):
        response = await client.get(f"{base_url}/health", timeout=timeout_s)
        return response.status_code == 200
    return False


async def idle(client: httpx.AsyncClient, base_url: str, timeout_s: float = 2.0) -> bool | None:
    """Whether ``/metrics`` shows nothing running or waiting; None when unreadable."""
    try:
        snapshot = await afetch_metrics(base_url, client, timeout=timeout_s)
    except MetricsError:
        return None
    return snapshot.idle
