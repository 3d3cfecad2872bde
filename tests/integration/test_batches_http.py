"""The Files and Batch APIs over real HTTP with the official ``openai`` SDK, against a real
gateway and a fake upstream: a 500-request batch end to end (every custom_id answered
once, bodies as the upstream wrote them, one ledger row each at the batch price), the
error file, cancel, upload validation with line numbers, tenant isolation, cursor pages,
and batch work yielding to interactive traffic."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from policies.auth import KeysFile
from tests.fixtures.fake_openai import TEXT_PIECES, FakeOpenAI, usage_for
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-batches-0123456789"
CHAT = "/v1/chat/completions"
PRICE_IN, PRICE_OUT = 1.0, 2.0  # USD per million tokens
DEADLINE_S = 60.0  # the longest any wait here may take
FINAL = {"completed", "failed", "expired", "cancelled"}
MAX_BODY = 20_000  # every route but the upload: the 500-line file is larger
MAX_FILE = 200_000  # the upload's own limit


@dataclass
class World:
    gateway: Gateway
    fake: FakeOpenAI
    acme: openai.OpenAI
    globex: openai.OpenAI
    acme_key: str

    def state(self) -> Any:
        return self.gateway.app.state.gateway


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("batches")
    keys = KeysFile(folder / "keys.json")
    acme_key, _ = keys.create("acme", "ci")
    globex_key, _ = keys.create("globex", "ci")
    fake = FakeOpenAI()
    price = f"{{input_per_mtok: {PRICE_IN}, output_per_mtok: {PRICE_OUT}}}"
    with serve(fake) as up:
        config = f"""
auth: {{admin_key_env: B_ADMIN, keys_file: {folder / "keys.json"}}}
tenants:
  acme: {{limits: {{rpm: 100000, tpm: 100000000}}}}
  globex: {{models: [chat]}}
ledger: {{path: {folder / "usage.sqlite3"}}}
server: {{max_body_bytes: {MAX_BODY}}}
batch:
  {{concurrency: 32, poll_interval_s: 0.2, yield_above_in_flight: 0, max_file_bytes: {MAX_FILE}}}
providers:
  oa: {{type: openai, base_url: "{up.url}/v1", api_key_env: B_OA}}
models:
  chat: {{targets: [{{provider: oa, model: m-count, price: {price}}}]}}
  broken: {{targets: [{{provider: oa, model: m-bad-request}}]}}
  slow: {{targets: [{{provider: oa, model: m-slow}}]}}
"""
        env = {"B_ADMIN": ADMIN, "B_OA": "sk-upstream"}
        with running_gateway(config, env) as gateway:

            def client(key: str) -> openai.OpenAI:
                return openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)

            yield World(gateway, fake, client(acme_key), client(globex_key), acme_key)


def request_line(custom_id: str, content: str, model: str = "chat") -> str:
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body})


def upload(client: openai.OpenAI, lines: list[str]) -> str:
    content = ("\n".join(lines) + "\n").encode()
    return client.files.create(file=("input.jsonl", content), purpose="batch").id


def run_batch(client: openai.OpenAI, lines: list[str]) -> Any:
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint=CHAT, completion_window="24h"
    )
    assert batch.status == "validating" and batch.object == "batch"
    return batch


def wait_until(client: openai.OpenAI, batch_id: str, statuses: set[str] = FINAL) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        assert time.monotonic() < deadline, f"batch stuck in {batch.status}"
        time.sleep(0.02)


def jsonl_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def ledger_rows(world: World, tenant: str) -> list[dict[str, Any]]:
    answer = httpx.get(
        world.gateway.url + "/admin/usage",
        params={"tenant": tenant},
        headers={"authorization": f"Bearer {ADMIN}"},
    )
    assert answer.status_code == 200, answer.text
    return [json.loads(line) for line in answer.text.splitlines() if line]


def contents_seen(fake: FakeOpenAI, marker: str) -> list[str]:
    """The user messages the upstream received that carry ``marker``."""
    found = []
    for request in list(fake.requests):
        content = ((request.json or {}).get("messages") or [{}])[-1].get("content")
        if isinstance(content, str) and marker in content:
            found.append(content)
    return found


def expected_body(content: str) -> dict[str, Any]:
    """What the fake upstream answers a chat request for ``content`` (m-count)."""
    body = {"model": "m-count", "messages": [{"role": "user", "content": content}]}
    message = {"role": "assistant", "content": "".join(TEXT_PIECES), "refusal": None}
    return {
        "id": "chatcmpl-fake123",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "m-count",
        "system_fingerprint": "fp_fake",
        "service_tier": "default",
        "choices": [
            {
                "index": 0,
                "message": {**message, "annotations": []},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": usage_for(body),
    }


def test_the_sdk_runs_500_requests_each_once(world: World) -> None:
    contents = {f"req-{i}": f"five-hundred {i} " + "x" * (i % 17) for i in range(500)}
    started = time.monotonic()
    lines = [request_line(cid, text) for cid, text in contents.items()]
    assert len("\n".join(lines)) > MAX_BODY  # uploads are not bound by server.max_body_bytes
    batch = run_batch(world.acme, lines)
    done = wait_until(world.acme, batch.id)
    elapsed = time.monotonic() - started
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (500, 500)
    assert done.request_counts.failed == 0 and done.error_file_id is None
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    assert elapsed < 30, f"500 requests took {elapsed:.1f}s"

    lines = jsonl_of(world.acme, done.output_file_id)
    assert sorted(line["custom_id"] for line in lines) == sorted(contents)  # each once
    for line in lines:
        assert line["error"] is None and line["id"].startswith("batch_req_")
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"] == expected_body(contents[line["custom_id"]])
    seen = contents_seen(world.fake, "five-hundred ")
    assert sorted(seen) == sorted(contents.values())  # the upstream got each exactly once

    rows = [r for r in ledger_rows(world, "acme") if r["client_request_id"] in contents]
    assert len(rows) == 500
    assert {r["request_id"] for r in rows} == {line["response"]["request_id"] for line in lines}
    for row in rows:  # billed at the batch price (discount 0.5)
        full = (row["prompt_tokens"] * PRICE_IN + row["completion_tokens"] * PRICE_OUT) / 1e6
        assert row["BilledCost"] == pytest.approx(full * 0.5, rel=1e-6)
        assert row["status"] == 200 and row["key_id"] is not None


def test_requests_the_upstream_refuses_go_to_the_error_file(world: World) -> None:
    lines = [request_line(f"ok-{i}", f"mixed {i}") for i in range(6)]
    lines += [request_line(f"bad-{i}", f"mixed bad {i}", "broken") for i in range(3)]
    done = wait_until(world.acme, run_batch(world.acme, lines).id)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (6, 3)
    output = jsonl_of(world.acme, done.output_file_id)
    errors = jsonl_of(world.acme, done.error_file_id)
    assert sorted(x["custom_id"] for x in output) == [f"ok-{i}" for i in range(6)]
    assert sorted(x["custom_id"] for x in errors) == [f"bad-{i}" for i in range(3)]
    for line in errors:
        assert line["response"]["status_code"] == 400
        assert line["response"]["body"]["error"]["message"] == "bad request from upstream"


def test_cancel_drops_what_has_not_started(world: World) -> None:
    world.fake.slow_seconds = 0.5
    lines = [request_line(f"c-{i}", f"cancel me {i}", "slow") for i in range(120)]
    batch = run_batch(world.acme, lines)
    deadline = time.monotonic() + DEADLINE_S
    while not contents_seen(world.fake, "cancel me "):  # wait until items are running
        assert time.monotonic() < deadline
        time.sleep(0.01)
    cancelling = world.acme.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    done = wait_until(world.acme, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    counts = done.request_counts
    assert counts is not None and counts.total == 120
    ran = len(contents_seen(world.fake, "cancel me "))
    assert 1 <= ran <= 32  # the running ones finished, nothing started after the cancel
    assert (counts.completed, counts.failed) == (ran, 120 - ran)
    dropped = jsonl_of(world.acme, done.error_file_id)
    assert {x["error"]["code"] for x in dropped} == {"batch_cancelled"}
    assert len(jsonl_of(world.acme, done.output_file_id)) == ran


def test_an_invalid_file_is_refused_with_its_line_numbers(world: World) -> None:
    lines = [
        request_line("a", "x"),
        "{not json",
        request_line("a", "duplicate"),
        request_line("m", "x", model="no-such-alias"),
    ]
    with pytest.raises(openai.BadRequestError) as raised:
        upload(world.acme, lines)
    error = raised.value.body
    assert isinstance(error, dict) and error["param"] == "file"
    assert error["code"] == "invalid_file"
    for where in ("Line 2:", "Line 3:", "Line 4:"):
        assert where in error["message"]
    assert "Line 1:" not in error["message"]
    with pytest.raises(openai.BadRequestError):  # only batch files are stored here
        world.acme.files.create(file=("x.jsonl", b"{}"), purpose="fine-tune")  # type: ignore[arg-type]


def test_uploads_have_their_own_size_limit(world: World) -> None:
    big = [request_line(f"big-{i}", "y" * 1000) for i in range(MAX_FILE // 1000 + 10)]
    with pytest.raises(openai.APIStatusError) as raised:
        upload(world.acme, big)
    assert raised.value.status_code == 413
    chat = httpx.post(
        world.gateway.base_url + "/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "z" * MAX_BODY}]},
        headers={"authorization": f"Bearer {world.acme_key}"},
    )
    assert chat.status_code == 413  # the other routes keep server.max_body_bytes


def test_a_tenant_never_reaches_another_tenants_files_or_batches(world: World) -> None:
    batch = run_batch(world.acme, [request_line("iso", "isolation")])
    done = wait_until(world.acme, batch.id)
    ids = [batch.input_file_id, done.output_file_id or ""]
    for file_id in ids:
        with pytest.raises(openai.NotFoundError):
            world.globex.files.retrieve(file_id)
        with pytest.raises(openai.NotFoundError):
            world.globex.files.content(file_id)
        with pytest.raises(openai.NotFoundError):
            world.globex.files.delete(file_id)
    with pytest.raises(openai.NotFoundError):
        world.globex.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        world.globex.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):
        world.globex.batches.create(
            input_file_id=batch.input_file_id, endpoint=CHAT, completion_window="24h"
        )
    assert not set(ids) & {f.id for f in world.globex.files.list()}
    assert batch.id not in {b.id for b in world.globex.batches.list()}
    assert world.acme.files.retrieve(batch.input_file_id).id == batch.input_file_id
    assert world.acme.files.delete(batch.input_file_id).deleted is True
    with pytest.raises(openai.NotFoundError):
        world.acme.files.retrieve(batch.input_file_id)


def test_lists_page_with_cursors(world: World) -> None:
    made = [upload(world.globex, [request_line(f"p{i}", "page", "chat")]) for i in range(5)]
    listed = [f.id for f in world.globex.files.list(limit=2)]  # the SDK follows the cursor
    assert listed[:5] == made[::-1] and len(listed) == len(set(listed))
    page = httpx.get(
        world.gateway.base_url + "/files",
        params={"limit": 2, "after": made[3]},
        headers={"authorization": f"Bearer {world.acme_key}"},
    )
    assert page.status_code == 400 and page.json()["error"]["param"] == "after"  # not acme's
    first = world.globex.batches.list(limit=1)
    assert first.has_more is (len(list(world.globex.batches.list())) > 1)
    raw = world.globex.files.with_raw_response.list(limit=2).http_response.json()
    assert raw["object"] == "list" and raw["has_more"] is True
    assert raw["first_id"] == made[4] and raw["last_id"] == made[3]


def test_batch_work_waits_for_interactive_requests(world: World) -> None:
    world.fake.slow_seconds = 1.5
    gateway_state = world.state()
    interactive = threading.Thread(
        target=lambda: world.acme.chat.completions.create(
            model="slow", messages=[{"role": "user", "content": "interactive"}]
        )
    )
    interactive.start()
    deadline = time.monotonic() + DEADLINE_S
    while gateway_state.in_flight.requests < 1:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    batch = run_batch(world.acme, [request_line(f"y{i}", f"yielding {i}") for i in range(5)])
    while interactive.is_alive():  # ~1.5 s in which the batch would otherwise finish
        assert contents_seen(world.fake, "yielding ") == [], "batch ran beside interactive"
        time.sleep(0.01)
    interactive.join()
    done = wait_until(world.acme, batch.id)
    assert done.status == "completed"
    assert len(contents_seen(world.fake, "yielding ")) == 5
