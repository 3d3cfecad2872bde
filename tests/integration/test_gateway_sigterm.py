"""Graceful shutdown of a real gateway process under load: SIGTERM while client threads keep
sending (plain, streamed, and slow requests that are in flight at the signal); the process
drains and exits with code 0, and every request the client received completely has exactly
one row in the SQLite ledger file (read directly after the exit)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from core.tenancy import UsageRow
from policies.auth import KeysFile
from policies.ledger.sqlite import SqliteLedger
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.processes import GatewayProcess

SLOW_S = 1.5  # m-slow and m-slow-stream take this long: they straddle the signal


@dataclass
class Outcome:
    """What one client thread saw, request by request."""

    sent: list[str] = field(default_factory=list)
    complete: list[str] = field(default_factory=list)  # 200 with the whole body read
    spans: list[tuple[float, float]] = field(default_factory=list)  # of the complete ones


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    app = FakeOpenAI()
    app.slow_seconds = SLOW_S
    with serve(app) as server:
        yield server.url


def write_config(folder: Path, upstream_url: str) -> tuple[Path, str]:
    keys = KeysFile(folder / "keys.json")
    key, _ = keys.create("acme", "sigterm")
    config = folder / "gateway.yaml"
    config.write_text(f"""
server: {{drain_timeout_s: 20, watch_config: false}}
logging: {{level: warning}}
auth: {{keys_file: {folder / "keys.json"}}}
tenants:
  acme: {{limits: {{rpm: 100000, concurrency: 1000}}}}
ledger: {{path: {folder / "usage.sqlite3"}}}
providers:
  oa: {{type: openai, base_url: "{upstream_url}/v1", api_key_env: S_OA}}
models:
  count: {{targets: [{{provider: oa, model: m-count}}]}}
  slow: {{targets: [{{provider: oa, model: m-slow}}]}}
  slow-stream: {{targets: [{{provider: oa, model: m-slow-stream}}]}}
""")
    return config, key


def complete(response: httpx.Response, stream: bool) -> bool:
    """Whether the client got the whole answer: a 200 with a parseable body (JSON), or a
    stream that reached ``[DONE]``."""
    if response.status_code != 200:
        return False
    if stream:
        return response.text.rstrip().endswith("data: [DONE]")
    return bool(response.json()["choices"])


def client_loop(
    url: str, key: str, name: str, model: str, stream: bool, stop: threading.Event, out: Outcome
) -> None:
    """Send requests one after another until ``stop``; a refused or reset connection (the
    gateway stopped listening) is simply a request that did not complete."""
    headers = {"authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30.0) as client:
        n = 0
        while not stop.is_set():
            n += 1
            request_id = f"sig-{name}-{n:05d}"
            out.sent.append(request_id)
            body = {
                "model": model,
                "stream": stream,
                "messages": [{"role": "user", "content": "q" * (n % 97 + 1)}],
            }
            started = time.monotonic()
            try:
                response = client.post(
                    "/v1/chat/completions", json=body, headers={"x-request-id": request_id}
                )
                if complete(response, stream):
                    out.complete.append(request_id)
                    out.spans.append((started, time.monotonic()))
            except httpx.HTTPError:
                time.sleep(0.02)  # the gateway is going away; try again until told to stop


def read_ledger(path: Path) -> list[UsageRow]:
    async def read() -> list[UsageRow]:
        ledger = SqliteLedger(path)
        try:
            return [row async for row in ledger.rows()]
        finally:
            await ledger.aclose()

    return asyncio.run(read())


WORKERS = [("plain", "count", False), ("stream", "count", True), ("plain2", "count", False)]
WORKERS += [(f"slow{i}", "slow", False) for i in range(3)]
WORKERS += [(f"slowstream{i}", "slow-stream", True) for i in range(2)]


def load_then_sigterm(gateway: GatewayProcess, key: str, outcomes: dict[str, Outcome]) -> float:
    """Start the gateway and the client threads; once well into the load, SIGTERM it and
    wait for its exit. Returns when the signal was sent (``time.monotonic()``)."""
    stop = threading.Event()
    with gateway:
        threads = [
            threading.Thread(
                target=client_loop,
                daemon=True,
                args=(gateway.url, key, name, model, stream, stop, outcomes[name]),
            )
            for name, model, stream in WORKERS
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 20
        while sum(len(o.complete) for o in outcomes.values()) < 60:
            assert time.monotonic() < deadline, gateway.log_path.read_text()[-2000:]
            time.sleep(0.05)
        signalled = time.monotonic()
        gateway.terminate(timeout_s=60)
        stop.set()
        for thread in threads:
            thread.join(timeout=40)
    return signalled


def test_sigterm_drains_and_keeps_every_completed_row(tmp_path: Path, upstream: str) -> None:
    config, key = write_config(tmp_path, upstream)
    gateway = GatewayProcess(config, {"S_OA": "sk-upstream"}, tmp_path / "gateway.log")
    outcomes = {name: Outcome() for name, _, _ in WORKERS}
    signalled = load_then_sigterm(gateway, key, outcomes)
    assert gateway.proc is not None
    code = gateway.proc.returncode
    log = gateway.log_path.read_text()[-3000:]
    assert code == 0, log

    rows = read_ledger(tmp_path / "usage.sqlite3")
    ids = Counter(row.client_request_id for row in rows)
    assert ids and max(ids.values()) == 1  # no row twice
    sent = {rid for o in outcomes.values() for rid in o.sent}
    assert set(ids) <= sent
    by_id = {row.client_request_id: row for row in rows}
    done = [rid for o in outcomes.values() for rid in o.complete]
    missing = [rid for rid in done if rid not in by_id]
    assert not missing, (missing[:5], log)
    assert all(by_id[rid].status == 200 for rid in done)
    # Draining really happened: slow requests that were in flight at the signal finished.
    straddled = [
        span
        for name in outcomes
        if name.startswith("slow")
        for span in outcomes[name].spans
        if span[0] < signalled < span[1] - 0.1
    ]
    assert straddled, "no slow request was in flight across the SIGTERM"
