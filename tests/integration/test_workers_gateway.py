"""``workers:`` through a real ``switchyard serve`` process: the gateway starts two fake
workers (tests/fixtures/fake_worker.py, engine ``command``) as replicas of one provider and
routes to both; a worker killed with SIGKILL is restarted while requests keep succeeding on
the other one; a reload that changes one entry replaces that worker and leaves the other
alone; SIGTERM lets an answer in flight finish and leaves no worker process behind.
``GET /admin/targets``, ``switchyard workers status`` and ``/metrics`` report them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.cli.main import main as cli
from tests.integration.processes import GatewayProcess
from tests.integration.workers_helpers import command_entry, free_range, group_gone, wait_for

ADMIN = "sy-admin-workers-0123456789abcdef"


def write_config(path: Path, ports: dict[str, tuple[int, int]], tag_b: str = "v1") -> None:
    path.write_text(f"""
server: {{watch_config: false, drain_timeout_s: 20}}
logging: {{level: info}}
auth: {{admin_key_env: W_ADMIN}}
ledger: {{path: {path.parent / "usage.sqlite3"}, spool_path: {path.parent / "spool.sqlite3"}}}
routing: {{retry_backoff_s: 0.01, breaker: {{cooldown_s: 0.5}}}}
providers:
  pool: {{type: vllm, saturation: {{poll_interval_s: 0.05, stale_after_s: 2}}}}
models:
  m: {{strategy: round_robin, targets: [{{provider: pool, model: fake}}]}}
workers:
  a: {command_entry("a", "pool", ports["a"])}
  b: {command_entry("b", "pool", ports["b"], "--tag", tag_b)}
""")


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    ports = {"a": free_range(3), "b": free_range(3)}
    config = tmp_path / "gateway.yaml"
    write_config(config, ports)
    process = GatewayProcess(config, {"W_ADMIN": ADMIN}, tmp_path / "gateway.log")
    process.ports = ports  # type: ignore[attr-defined]
    with process:
        wait_for(lambda: serving(process) == {"a", "b"}, what="both workers routed")
        yield process


def admin(gw: GatewayProcess, path: str) -> Any:
    answer = httpx.get(gw.url + path, headers={"authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()


def workers(gw: GatewayProcess) -> dict[str, dict[str, Any]]:
    """The current process of each entry, by name."""
    rows = admin(gw, "/admin/targets")["workers"]
    return {row["name"]: row for row in rows if not row["outgoing"]}


def serving(gw: GatewayProcess) -> set[str]:
    """Entries whose worker is ready and has a routed, polled target."""
    return {
        name
        for name, row in workers(gw).items()
        if row["state"] == "ready" and row["targets"] and row["running"] is not None
    }


def chat(gw: GatewayProcess, content: str = "hi", stream: bool = False) -> httpx.Response:
    body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": content}]}
    return httpx.post(gw.base_url + "/chat/completions", json=body, timeout=30)


def log_events(gw: GatewayProcess) -> list[dict[str, Any]]:
    """The gateway's JSON log lines (other output skipped)."""
    events = []
    for line in gw.log_path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                events.append(event)
    return events


def answered_by(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    text: str = response.json()["choices"][0]["message"]["content"]
    return text


def test_workers_serve_as_replicas_and_a_killed_one_is_restarted(
    gateway: GatewayProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = workers(gateway)
    assert {rows[n]["pid"] for n in "ab"} and rows["a"]["pid"] != rows["b"]["pid"]
    assert rows["a"]["targets"] == [f"pool@127.0.0.1:{rows['a']['port']}/fake"]
    texts = {answered_by(chat(gateway)).rsplit(" tag=")[0] for _ in range(6)}
    assert texts == {f"worker={n} pid={rows[n]['pid']}" for n in "ab"}  # round robin: both

    os.kill(rows["a"]["pid"], signal.SIGKILL)
    during = [chat(gateway) for _ in range(12)]  # a is down or restarting meanwhile
    assert [r.status_code for r in during] == [200] * 12
    wait_for(lambda: workers(gateway)["a"]["restarts"] == 1, what="a restarted")
    wait_for(lambda: serving(gateway) == {"a", "b"}, what="a routed again")
    restarted = workers(gateway)["a"]
    assert restarted["pid"] != rows["a"]["pid"]
    assert restarted["last_exit_code"] == -signal.SIGKILL
    assert workers(gateway)["b"]["pid"] == rows["b"]["pid"]
    wait_for(
        lambda: f"pid={restarted['pid']}" in answered_by(chat(gateway)), what="a answers again"
    )
    crashed = [e for e in log_events(gateway) if e.get("event") == "worker.crashed"]
    assert [(e["worker"], e["exit_code"], e["reason"]) for e in crashed] == [
        ("a", -signal.SIGKILL, "exited")
    ]
    metrics = httpx.get(gateway.url + "/metrics", timeout=10).text
    assert 'switchyard_worker_restarts_total{replica="0",worker="a"} 1.0' in metrics
    assert 'switchyard_worker_state{replica="0",state="ready",worker="b"} 1.0' in metrics

    capsys.readouterr()
    code = cli(["workers", "status", "--url", gateway.url, "--admin-key", ADMIN])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert lines[0].split()[:4] == ["WORKER", "STATE", "PID", "PORT"]
    assert lines[1].split()[:4] == ["a/0", "ready", str(restarted["pid"]), str(restarted["port"])]
    assert lines[1].split()[5] == "1"  # restarts


def test_a_reload_replaces_the_changed_worker_only(gateway: GatewayProcess) -> None:
    before = workers(gateway)
    write_config(gateway.config_path, gateway.ports, tag_b="v2")  # type: ignore[attr-defined]
    answer = httpx.post(
        gateway.url + "/admin/reload", headers={"authorization": f"Bearer {ADMIN}"}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    wait_for(
        lambda: workers(gateway)["b"]["generation"] == 1 and serving(gateway) == {"a", "b"},
        what="b replaced",
    )
    wait_for(lambda: len(admin(gateway, "/admin/targets")["workers"]) == 2, what="old b gone")
    after = workers(gateway)
    assert after["a"]["pid"] == before["a"]["pid"]  # untouched
    assert after["b"]["pid"] != before["b"]["pid"]
    assert group_gone(before["b"]["pid"])
    wait_for(lambda: "worker=b" in answered_by(chat(gateway)), what="b answers")
    texts = [answered_by(chat(gateway)) for _ in range(4)]
    assert all("tag=v2" in t for t in texts if "worker=b" in t)


def test_sigterm_drains_an_answer_in_flight_and_stops_every_worker(
    gateway: GatewayProcess,
) -> None:
    pids = [row["pid"] for row in workers(gateway).values()]
    started = threading.Event()
    result: dict[str, Any] = {}

    def stream() -> None:
        body = {
            "model": "m",
            "stream": True,
            "messages": [{"role": "user", "content": "sleep:1.5"}],
        }
        with httpx.stream(
            "POST", gateway.base_url + "/chat/completions", json=body, timeout=30
        ) as r:
            result["status"] = r.status_code
            lines = []
            for line in r.iter_lines():
                started.set()
                lines.append(line)
            result["lines"] = lines

    client = threading.Thread(target=stream)
    client.start()
    assert started.wait(30)
    code = gateway.terminate(timeout_s=60)
    client.join(30)
    assert code == 0
    assert result["status"] == 200
    assert [line for line in result["lines"] if line][-1] == "data: [DONE]"
    assert all(group_gone(pid) for pid in pids)
    stopped = [e["worker"] for e in log_events(gateway) if e.get("event") == "worker.stopped"]
    assert sorted(stopped) == ["a", "b"]


def test_a_gateway_killed_outright_takes_its_workers_along(gateway: GatewayProcess) -> None:
    pids = [row["pid"] for row in workers(gateway).values()]
    gateway.kill()  # SIGKILL: no shutdown code runs; the parent-death signal stops them
    wait_for(lambda: all(group_gone(pid) for pid in pids), limit_s=15, what="workers gone")
