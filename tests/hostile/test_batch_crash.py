"""Batches across real gateway processes sharing one job store (issue 17): a gateway killed
with SIGKILL mid-batch and started again finishes the batch with every custom_id answered
exactly once and no item run twice while its lease held; two gateways on one store run
each item exactly once between them; a gateway stopped with SIGTERM hands its items back
at once (the next one does not wait for leases to run out).

The upstream is the fake OpenAI API in this process, answering ``m-slow`` after
``SLOW_S``; it records every call, and each request's text names its custom_id, so the
tests count executions per item at the source."""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from policies.auth import KeysFile
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.processes import GatewayProcess

pytestmark = pytest.mark.hostile

ADMIN = "sk-admin-batch-crash"
SLOW_S = 0.1  # each upstream call; 200 items / 8 at once = 2.5 s of work
ITEMS = 200
CONCURRENCY = 8
WAIT_S = 60.0  # the longest any wait here may take


@dataclass
class Site:
    """A config (with its job store and ledger) that gateway processes are started on."""

    folder: Path
    config: Path
    key: str
    upstream: FakeOpenAI
    starts: int = 0

    def gateway(self, stack: ExitStack) -> GatewayProcess:
        """A new gateway process on this config, stopped (SIGKILL) when ``stack`` ends."""
        self.starts += 1
        env = {"H_ADMIN": ADMIN, "H_OA": "sk-upstream"}
        process = GatewayProcess(self.config, env, self.folder / f"gateway-{self.starts}.log")
        stack.callback(process.kill)
        return process.start()

    def calls(self, prefix: str) -> Counter[str]:
        """custom_id -> how many times the upstream was called for it."""
        seen: Counter[str] = Counter()
        for request in list(self.upstream.requests):
            content = ((request.json or {}).get("messages") or [{}])[-1].get("content")
            if isinstance(content, str) and content.startswith(prefix):
                seen[content] += 1
        return seen


@pytest.fixture
def site(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Site]:
    lease_s, drain_s, slow_s = getattr(request, "param", (2.0, 10.0, SLOW_S))
    key, _ = KeysFile(tmp_path / "keys.json").create("acme", "crash")
    upstream = FakeOpenAI()
    upstream.slow_seconds = slow_s
    with serve(upstream) as up:
        config = tmp_path / "gateway.yaml"
        config.write_text(f"""
server: {{watch_config: false, drain_timeout_s: {drain_s}}}
logging: {{level: info, json: true}}
auth: {{admin_key_env: H_ADMIN, keys_file: {tmp_path / "keys.json"}}}
tenants: {{acme: {{}}}}
ledger: {{path: {tmp_path / "usage.sqlite3"}}}
batch: {{concurrency: {CONCURRENCY}, lease_s: {lease_s}, poll_interval_s: 0.2}}
providers:
  oa: {{type: openai, base_url: "{up.url}/v1", api_key_env: H_OA}}
models:
  slow: {{targets: [{{provider: oa, model: m-slow}}]}}
""")
        yield Site(tmp_path, config, key, upstream)


def client(gateway: GatewayProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=2, timeout=30)


def create_batch(sdk: openai.OpenAI, prefix: str, items: int = ITEMS) -> tuple[str, list[str]]:
    ids = [f"{prefix}{i:03d}" for i in range(items)]
    lines = [
        json.dumps(
            {
                "custom_id": cid,
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "slow", "messages": [{"role": "user", "content": cid}]},
            }
        )
        for cid in ids
    ]
    file = sdk.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch")
    batch = sdk.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return batch.id, ids


def wait_for(condition: Any, what: str, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def completed(sdk: openai.OpenAI, batch_id: str, timeout_s: float = WAIT_S) -> Any:
    def final() -> Any:
        batch = sdk.batches.retrieve(batch_id)
        return batch if batch.status in ("completed", "failed", "expired", "cancelled") else None

    batch = wait_for(final, "the batch to end", timeout_s)
    assert batch.status == "completed", batch
    return batch


def output_ids(sdk: openai.OpenAI, batch: Any) -> list[str]:
    assert batch.error_file_id is None
    text = sdk.files.content(batch.output_file_id).text
    return [json.loads(line)["custom_id"] for line in text.splitlines()]


def ledger_ids(gateway: GatewayProcess, prefix: str) -> list[str]:
    answer = httpx.get(
        gateway.url + "/admin/usage",
        params={"tenant": "acme"},
        headers={"authorization": f"Bearer {ADMIN}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    rows = [json.loads(line) for line in answer.text.splitlines() if line]
    return [
        r["client_request_id"] for r in rows if (r["client_request_id"] or "").startswith(prefix)
    ]


def test_a_killed_gateway_resumes_without_repeats_or_losses(site: Site) -> None:
    with ExitStack() as stack:
        first = site.gateway(stack)
        batch_id, ids = create_batch(client(first, site.key), "kill-")
        wait_for(lambda: len(site.calls("kill-")) >= ITEMS // 4, "a quarter of the work")
        first.kill()  # SIGKILL: no shutdown, leases left behind
        at_kill = site.calls("kill-")
        assert len(at_kill) < ITEMS, "the batch finished before the kill"

        second = site.gateway(stack)
        sdk = client(second, site.key)
        batch = completed(sdk, batch_id)
        assert batch.request_counts.completed == ITEMS
        assert sorted(output_ids(sdk, batch)) == ids  # every item answered, once

        calls = site.calls("kill-")
        assert set(calls) == set(ids)
        reruns = sum(count - 1 for count in calls.values())
        # Only items whose call was in flight at the kill (at most one per slot) ran again.
        assert reruns <= CONCURRENCY, calls.most_common(CONCURRENCY + 1)
        rows = ledger_ids(second, "kill-")
        assert set(rows) == set(ids)
        assert ITEMS <= len(rows) <= ITEMS + reruns


@pytest.mark.parametrize("site", [(30.0, 10.0, SLOW_S)], indirect=True)  # leases hold
def test_two_gateways_on_one_store_run_each_item_once(site: Site) -> None:
    with ExitStack() as stack:
        one, two = site.gateway(stack), site.gateway(stack)
        batch_id, ids = create_batch(client(one, site.key), "pair-")
        batch = completed(client(two, site.key), batch_id)
        assert sorted(output_ids(client(two, site.key), batch)) == ids
        calls = site.calls("pair-")
        assert set(calls) == set(ids) and set(calls.values()) == {1}  # exactly once each
        assert sorted(ledger_ids(one, "pair-")) == ids
        share = [ran_here(process, "pair-") for process in (one, two)]
        assert sum(share) == ITEMS and min(share) > 0, share  # both took part


def ran_here(process: GatewayProcess, prefix: str) -> int:
    """Batch requests this process served, from its own log lines."""
    count = 0
    for line in process.log_path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "request.completed" and str(
            record.get("client_request_id")
        ).startswith(prefix):
            count += 1
    return count


# 30 s leases; a drain timeout shorter than one upstream call, so SIGTERM cuts items off
@pytest.mark.parametrize("site", [(30.0, 0.2, 0.5)], indirect=True)
def test_a_stopped_gateway_hands_its_items_back(site: Site) -> None:
    with ExitStack() as stack:
        first = site.gateway(stack)
        batch_id, ids = create_batch(client(first, site.key), "stop-", items=40)
        wait_for(lambda: len(site.calls("stop-")) > CONCURRENCY, "a second round of items")
        assert first.terminate(timeout_s=30) == 0
        with closing(sqlite3.connect(site.folder / "switchyard-batches.sqlite3")) as store:
            states = dict(store.execute("SELECT state, count(*) FROM items GROUP BY state"))
        assert "running" not in states and states["pending"] > 0  # all handed back

        second = site.gateway(stack)
        sdk = client(second, site.key)
        batch = completed(sdk, batch_id, timeout_s=20)  # no wait for the 30 s leases
        assert sorted(output_ids(sdk, batch)) == ids
        calls = site.calls("stop-")
        assert sum(n - 1 for n in calls.values()) <= CONCURRENCY  # only cut ones ran again
