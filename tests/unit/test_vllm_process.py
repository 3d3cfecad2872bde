"""local_tier.vllm.process life cycle, on a small fake worker (a real process group with a
child, a /health and a /metrics) so it runs in the fast suite; the real vLLM is exercised in
tests/integration/test_vllm_real.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from local_tier.vllm.process import (
    VllmProcess,
    VllmSettings,
    WorkerProcess,
    WorkerStartError,
    _live_members,
    default_cpu_dtype,
    free_port,
)

# argv: PORT BUSY_READS STUBBORN. Serves /health, /child (the child's pid), /reads (how many
# times /metrics was read) and /metrics, whose num_requests_running is 1 for the first
# BUSY_READS reads, then 0. The child sleeps, ignoring SIGTERM when STUBBORN is 1 (as a wedged
# engine process would).
FAKE_WORKER = r"""
import http.server, signal, subprocess, sys
port, busy, stubborn = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
code = "import signal, time\n"
if stubborn:
    code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
child = subprocess.Popen([sys.executable, "-c", code + "time.sleep(600)"])
reads = [0]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/metrics":
            reads[0] += 1
            running = 1 if reads[0] <= busy else 0
            body = (f"vllm:num_requests_running {running}\nvllm:num_requests_waiting 0\n"
                    "vllm:kv_cache_usage_perc 0.1\n")
        elif self.path == "/child":
            body = str(child.pid)
        elif self.path == "/reads":
            body = str(reads[0])
        else:
            body = "ok"
        data = body.encode()
        self.send_response(200)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _fake(tmp_path: Path, busy: int = 0, stubborn: bool = False) -> WorkerProcess:
    port = free_port()
    argv = [sys.executable, "-c", FAKE_WORKER, str(port), str(busy), "1" if stubborn else "0"]
    return WorkerProcess(argv, port=port, log_path=tmp_path / "worker.log")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers signal 0; it has exited all the same.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def test_settings_build_the_documented_command_and_env() -> None:
    s = VllmSettings(
        port=8123,
        venv=Path("/v"),
        extra_args=("--seed", "1"),
        extra_env={"VLLM_CPU_KVCACHE_SPACE": "4"},
    )
    argv = s.command()
    assert argv[:5] == ["/v/bin/python", "-m", "vllm.entrypoints.cli.main", "serve", str(s.model)]
    for flag in ("--enable-prefix-caching", "--enable-prompt-tokens-details", "--enforce-eager"):
        assert flag in argv
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[-2:] == ["--seed", "1"]
    env = s.environment({"PATH": "/bin"})
    assert env["PATH"] == "/bin" and env["VLLM_HOST_IP"] == "127.0.0.1"
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"  # extra_env wins
    assert "--enforce-eager" not in VllmSettings(port=1, enforce_eager=False).command()
    assert "PYTHONPATH" not in env  # no shim folder in /v


@pytest.mark.parametrize(
    ("flags", "dtype"),
    [
        ("fpu avx2 avx512f avx512_bf16", "bfloat16"),
        ("fpu amx_bf16", "bfloat16"),
        ("fpu avx2 avx512f", "float32"),
    ],
)
def test_default_dtype_follows_the_cpu(tmp_path: Path, flags: str, dtype: str) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    assert default_cpu_dtype(info) == dtype
    assert default_cpu_dtype(tmp_path / "missing") == "float32"


def test_shim_goes_first_on_pythonpath(tmp_path: Path) -> None:
    (tmp_path / "shim").mkdir()
    env = VllmSettings(port=1, venv=tmp_path).environment({"PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"] == f"{tmp_path / 'shim'}{os.pathsep}/elsewhere"


def test_start_drain_stop_leaves_no_process(tmp_path: Path) -> None:
    worker = _fake(tmp_path, busy=3).start()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        worker.wait_healthy(timeout=30)
        assert worker.accepting
        child = int(httpx.get(f"{worker.base_url}/child", trust_env=False).text)
        assert worker.drain(timeout=30, poll=0.05)
        reads = int(httpx.get(f"{worker.base_url}/reads", trust_env=False).text)
        assert reads == 4  # three busy answers, then the idle one that ended the drain
        assert not worker.accepting
        worker.stop(grace=5)
        assert worker.pid is not None
        assert _live_members(worker.pid) == 0
        assert not _alive(worker.pid) and not _alive(child)
        assert _alive(bystander.pid)  # never signals what it did not start
        worker.stop()  # twice is harmless
    finally:
        worker.stop()
        bystander.kill()
        bystander.wait()


def test_stop_escalates_to_sigkill_after_grace(tmp_path: Path) -> None:
    worker = _fake(tmp_path, stubborn=True).start()
    try:
        worker.wait_healthy(timeout=30)
        child = int(httpx.get(f"{worker.base_url}/child", trust_env=False).text)
        t0 = time.monotonic()
        worker.stop(grace=1.0)
        assert time.monotonic() - t0 >= 1.0  # the child outlived SIGTERM
        assert not _alive(child)
    finally:
        worker.stop()


def test_drain_gives_up_at_its_deadline(tmp_path: Path) -> None:
    worker = _fake(tmp_path, busy=10_000).start()
    try:
        worker.wait_healthy(timeout=30)
        t0 = time.monotonic()
        assert not worker.drain(timeout=0.5, poll=0.05)
        assert time.monotonic() - t0 < 5
    finally:
        worker.stop()


def test_exit_before_healthy_reports_the_log(tmp_path: Path) -> None:
    code = "print('engine failed: no model'); raise SystemExit(3)"
    worker = WorkerProcess(
        [sys.executable, "-c", code], port=free_port(), log_path=tmp_path / "w.log"
    ).start()
    with pytest.raises(WorkerStartError, match=r"(?s)exited.*engine failed: no model"):
        worker.wait_healthy(timeout=30)
    worker.stop()


def test_not_healthy_by_the_deadline(tmp_path: Path) -> None:
    worker = WorkerProcess(
        [sys.executable, "-c", "import time; time.sleep(60)"], port=free_port()
    ).start()
    try:
        with pytest.raises(WorkerStartError, match="not healthy after"):
            worker.wait_healthy(timeout=0.5)
    finally:
        worker.stop(grace=5)
    assert worker.pid is not None and not _alive(worker.pid)


def test_vllm_process_needs_its_venv(tmp_path: Path) -> None:
    proc = VllmProcess(VllmSettings(port=free_port(), venv=tmp_path / "missing"))
    with pytest.raises(WorkerStartError, match=r"setup_vllm\.sh"):
        proc.start()
    proc.stop()  # never started: nothing to do
