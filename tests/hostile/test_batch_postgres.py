"""Batches across real gateway replicas sharing one PostgreSQL job store (and ledger), on a
database of this module's own on the machine's Postgres (issue 17, the fleet).

What "no duplicate" can mean: items are claimed under leases and run at least once. A
replica killed with SIGKILL leaves the items it was running (state ``running``, owner
``<host>:<its pid>:…``) to be re-claimed when their leases run out; any of those whose
upstream call had started ran twice, and no other item can (the live replicas renew their
leases, and a finished item is never claimable again). So the test reads the killed
replica's in-flight items from the store right after the kill and checks that:

- every custom_id is answered exactly once in the output file (the first result written
  wins), and ``request_counts.completed`` is the number of items;
- the upstream saw every item, at most twice, and only in-flight items twice (at most
  ``batch.concurrency`` of them);
- the ledger holds a row for every answer in the output (its ``request_id``), and extra
  rows only for re-run items: at most one per re-run.

Two replicas that both live run each item exactly once between them.
"""

from __future__ import annotations

import json
import socket
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import psycopg
import pytest

from policies.auth import KeysFile
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.hostile.test_batch_crash import ADMIN, client, completed, create_batch, wait_for
from tests.integration.processes import GatewayProcess

pytestmark = pytest.mark.hostile

ITEMS = 240
CONCURRENCY = 8  # per replica
SLOW_S = 0.15  # each upstream call: 240 items / 16 slots = 2.25 s of work
LEASE_S = 3.0


@dataclass
class Fleet:
    """Gateway replicas on one Postgres database (job store and ledger)."""

    folder: Path
    dsn: str
    key: str
    upstream: FakeOpenAI
    upstream_url: str
    starts: int = 0

    def replica(self, stack: ExitStack) -> GatewayProcess:
        """A new gateway process (its own config: its own ledger spool), SIGKILLed at the
        end of ``stack``."""
        self.starts += 1
        config = self.folder / f"replica-{self.starts}.yaml"
        config.write_text(f"""
server: {{watch_config: false, drain_timeout_s: 10}}
logging: {{level: info, json: true}}
auth: {{admin_key_env: H_ADMIN, keys_file: {self.folder / "keys.json"}}}
tenants: {{acme: {{}}}}
ledger: {{backend: postgres, dsn_env: H_DSN, spool_path: spool-{self.starts}.sqlite3}}
batch: {{backend: postgres, dsn_env: H_DSN, concurrency: {CONCURRENCY}, lease_s: {LEASE_S},
        poll_interval_s: 0.2}}
providers:
  oa: {{type: openai, base_url: "{self.upstream_url}/v1", api_key_env: H_OA}}
models:
  slow: {{targets: [{{provider: oa, model: m-slow}}]}}
""")
        env = {"H_ADMIN": ADMIN, "H_OA": "sk-upstream", "H_DSN": self.dsn}
        log = self.folder / f"replica-{self.starts}.log"
        process = GatewayProcess(config, env, log)
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

    def running_for(self, process: GatewayProcess) -> set[str]:
        """The custom_ids ``process``'s runner holds now (its owner names its pid)."""
        assert process.proc is not None
        owner = f"{socket.gethostname()}:{process.proc.pid}:%"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT custom_id FROM items WHERE state = 'running' AND owner LIKE %s",
                (owner,),
            ).fetchall()
        return {custom_id for (custom_id,) in rows}


@pytest.fixture
def fleet(tmp_path: Path, pg_dsn: str) -> Iterator[Fleet]:
    key, _ = KeysFile(tmp_path / "keys.json").create("acme", "fleet")
    upstream = FakeOpenAI()
    upstream.slow_seconds = SLOW_S
    with serve(upstream) as up:
        yield Fleet(tmp_path, pg_dsn, key, upstream, up.url)


def output(sdk: openai.OpenAI, batch: Any) -> list[dict[str, Any]]:
    assert batch.error_file_id is None
    return [json.loads(line) for line in sdk.files.content(batch.output_file_id).text.splitlines()]


def ledger_rows(replica: GatewayProcess, prefix: str) -> list[dict[str, Any]]:
    answer = httpx.get(
        replica.url + "/admin/usage",
        params={"tenant": "acme"},
        headers={"authorization": f"Bearer {ADMIN}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    rows = [json.loads(line) for line in answer.text.splitlines() if line]
    return [r for r in rows if (r["client_request_id"] or "").startswith(prefix)]


def test_a_replica_killed_mid_batch_loses_nothing_and_repeats_only_its_in_flight_items(
    fleet: Fleet,
) -> None:
    with ExitStack() as stack:
        doomed, survivor = fleet.replica(stack), fleet.replica(stack)
        batch_id, ids = create_batch(client(doomed, fleet.key), "fleet-", ITEMS)
        wait_for(
            lambda: len(fleet.calls("fleet-")) >= ITEMS // 4 and fleet.running_for(doomed),
            "a quarter of the work, with items running on the replica to kill",
        )
        doomed.kill()  # SIGKILL: no shutdown, its leases left behind
        in_flight = fleet.running_for(doomed)  # frozen until the leases run out
        assert 0 < len(in_flight) <= CONCURRENCY
        assert len(fleet.calls("fleet-")) < ITEMS, "the batch finished before the kill"
        restarted = fleet.replica(stack)  # the killed one comes back (a new pid)

        sdk = client(survivor, fleet.key)
        batch = completed(sdk, batch_id)
        assert batch.request_counts.completed == ITEMS
        lines = output(sdk, batch)
        assert sorted(line["custom_id"] for line in lines) == ids  # each answered once

        calls = fleet.calls("fleet-")
        assert set(calls) == set(ids)
        repeated = {cid for cid, n in calls.items() if n > 1}
        assert repeated <= in_flight and max(calls.values()) <= 2, (repeated, in_flight)

        rows = ledger_rows(restarted, "fleet-")
        answered = {line["response"]["request_id"] for line in lines}
        assert answered <= {row["request_id"] for row in rows}  # a row for every answer
        per_item = Counter(row["client_request_id"] for row in rows)
        assert set(per_item) == set(ids)
        assert all(per_item[cid] <= calls[cid] for cid in ids)  # no row without a call
        assert len(rows) - ITEMS <= len(repeated)


def test_two_live_replicas_run_each_item_exactly_once(fleet: Fleet) -> None:
    with ExitStack() as stack:
        one, two = fleet.replica(stack), fleet.replica(stack)
        batch_id, ids = create_batch(client(one, fleet.key), "pair-", ITEMS // 2)
        sdk = client(two, fleet.key)
        batch = completed(sdk, batch_id)
        assert sorted(line["custom_id"] for line in output(sdk, batch)) == ids
        calls = fleet.calls("pair-")
        assert set(calls) == set(ids) and set(calls.values()) == {1}
        assert sorted(row["client_request_id"] for row in ledger_rows(one, "pair-")) == ids
        took = [_served(process, "pair-") for process in (one, two)]
        assert sum(took) == ITEMS // 2 and min(took) > 0, took  # both took part


def _served(process: GatewayProcess, prefix: str) -> int:
    """Batch requests ``process`` served, from its own log lines."""
    count = 0
    for line in process.log_path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        cid = str(record.get("client_request_id"))
        if record.get("event") == "request.completed" and cid.startswith(prefix):
            count += 1
    return count
