"""Batches through the providers' own batch APIs (docs/batches.md, "Through the provider's
batch API"), over real HTTP with the official ``openai`` SDK as the gateway's client and
fake OpenAI and Anthropic upstreams at the HTTP layer: one upload and one upstream batch, no
chat completions; outputs equal the upstream's answers per custom_id (Anthropic's converted
to chat completions); refused lines in the error file; one ledger row per answered request
at the discounted price; submit 5xx retried; the provider's batch failing or expiring;
cancel propagating; a restarted gateway polling instead of resubmitting; and the config's
refusal of ``batch_api`` on a provider kind without one."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from core.config import ConfigError, parse_config
from policies.auth import KeysFile
from tests.fixtures.fake_anthropic import REPLY_TEXT, FakeAnthropic
from tests.fixtures.fake_openai import FakeOpenAI, usage_for
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-provider-batches-0123"
CHAT = "/v1/chat/completions"
PRICE_IN, PRICE_OUT = 3.0, 15.0  # USD per million tokens
DEADLINE_S = 30.0
FINAL = {"completed", "failed", "expired", "cancelled"}


@dataclass
class World:
    gateway: Gateway
    oa: FakeOpenAI
    an: FakeAnthropic
    client: openai.OpenAI
    folder: Path
    config: str
    env: dict[str, str]


def gateway_config(folder: Path, oa_url: str, an_url: str) -> str:
    price = f"{{input_per_mtok: {PRICE_IN}, output_per_mtok: {PRICE_OUT}}}"
    return f"""
auth: {{admin_key_env: PB_ADMIN, keys_file: {folder / "keys.json"}}}
tenants:
  acme: {{limits: {{rpm: 100000, usd_per_day: 1000}}}}
ledger: {{path: {folder / "usage.sqlite3"}}}
batch: {{path: {folder / "jobs.sqlite3"}, poll_interval_s: 0.1, provider_poll_interval_s: 0.05,
         lease_s: 3, max_retry_delay_s: 0.2}}
providers:
  oa: {{type: openai, base_url: "{oa_url}/v1", api_key_env: PB_OA, batch_api: true}}
  an: {{type: anthropic, base_url: "{an_url}", api_key_env: PB_AN, batch_api: true}}
  plain: {{type: openai, base_url: "{oa_url}/v1", api_key_env: PB_OA}}
models:
  oa-batch: {{targets: [{{provider: oa, model: m-count, price: {price}}}]}}
  an-batch: {{targets: [{{provider: an, model: claude-fake, price: {price}}}]}}
  plain: {{targets: [{{provider: plain, model: m-count}}]}}
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("provider-batches")
    key, _ = KeysFile(folder / "keys.json").create("acme", "ci")
    oa, an = FakeOpenAI(), FakeAnthropic()
    with serve(oa) as oa_server, serve(an) as an_server:
        config = gateway_config(folder, oa_server.url, an_server.url)
        env = {"PB_ADMIN": ADMIN, "PB_OA": "sk-oa", "PB_AN": "sk-an"}
        with running_gateway(config, env) as gateway:
            client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
            yield World(gateway, oa, an, client, folder, config, env)


@pytest.fixture(autouse=True)
def fresh_fakes(world: World) -> Iterator[None]:
    for api in (world.oa.batch_api, world.an.batch_api):
        api.polls_to_complete, api.create_failures = 2, 0
    world.oa.batch_api.final_status = "completed"
    yield


def line(custom_id: str, content: str, model: str = "oa-batch") -> str:
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body})


def create(client: openai.OpenAI, lines: list[str]) -> str:
    data = ("\n".join(lines) + "\n").encode()
    upload = client.files.create(file=("in.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    return batch.id


def wait_for(client: openai.OpenAI, batch_id: str, statuses: set[str] = FINAL) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        assert time.monotonic() < deadline, f"batch stuck in {batch.status}"
        time.sleep(0.05)


def until(condition: Any) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


def by_custom_id(client: openai.OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    assert file_id is not None
    lines = [json.loads(x) for x in client.files.content(file_id).text.splitlines()]
    return {x["custom_id"]: x for x in lines}


def ledger(world: World) -> dict[str, dict[str, Any]]:
    answer = httpx.get(
        world.gateway.url + "/admin/usage",
        params={"tenant": "acme"},
        headers={"authorization": f"Bearer {ADMIN}"},
    )
    assert answer.status_code == 200, answer.text
    rows = [json.loads(x) for x in answer.text.splitlines() if x]
    return {row["request_id"]: row for row in rows}


def chat_posts(fake: FakeOpenAI | FakeAnthropic, path: str) -> int:
    return sum(1 for r in fake.requests if r.method == "POST" and r.path == path)


def discounted(row: dict[str, Any]) -> float:
    full = row["prompt_tokens"] * PRICE_IN + row["completion_tokens"] * PRICE_OUT
    return 0.5 * full / 1e6


def test_an_openai_batch_runs_through_the_providers_batch_api(world: World) -> None:
    oa, uploads, created = world.oa, world.oa.batch_api.uploads, world.oa.batch_api.created
    chats = chat_posts(oa, "/v1/chat/completions")
    contents = {f"q{i}": f"question {i} " + "x" * i for i in range(5)}
    lines = [line(cid, text) for cid, text in contents.items()]
    lines += [line("no", "refuse: this one"), line("gone", "line-error: that one")]
    done = wait_for(world.client, create(world.client, lines))

    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (5, 2)
    assert (oa.batch_api.uploads, oa.batch_api.created) == (uploads + 1, created + 1)
    assert chat_posts(oa, "/v1/chat/completions") == chats  # not one request at a time
    output = by_custom_id(world.client, done.output_file_id)
    assert sorted(output) == sorted(contents)
    for cid, text in contents.items():
        upstream = {"model": "m-count", "messages": [{"role": "user", "content": text}]}
        assert output[cid]["response"]["status_code"] == 200
        assert output[cid]["response"]["body"] == oa.chat_payload(upstream)
    errors = by_custom_id(world.client, done.error_file_id)
    assert errors["no"]["response"]["status_code"] == 400
    assert errors["no"]["response"]["body"]["error"]["message"] == "refused by the fake"
    assert errors["gone"]["response"] is None
    assert errors["gone"]["error"] == {
        "code": "invalid_request",
        "message": "The line was refused.",
    }

    rows = ledger(world)
    answered = [*output.values(), errors["no"]]
    assert all(x["response"]["request_id"] in rows for x in answered)  # one row each
    for cid, text in contents.items():
        row = rows[output[cid]["response"]["request_id"]]
        assert (
            row["prompt_tokens"]
            == usage_for({"model": "m-count", "messages": [{"role": "user", "content": text}]})[
                "prompt_tokens"
            ]
        )
        assert (row["provider"], row["ResourceId"], row["model"]) == (
            "oa",
            "m-count",
            "oa-batch",
        )
        assert row["client_request_id"] == cid and row["status"] == 200
        assert row["BilledCost"] == pytest.approx(discounted(row), rel=1e-9)
    assert rows[errors["no"]["response"]["request_id"]]["BilledCost"] == 0
    assert done.usage.input_tokens == sum(
        rows[o["response"]["request_id"]]["prompt_tokens"] for o in output.values()
    )


def spent_today(world: World) -> float:
    answer = httpx.get(
        world.gateway.url + "/admin/tenants/acme/quota",
        headers={"authorization": f"Bearer {ADMIN}"},
    )
    assert answer.status_code == 200, answer.text
    (day,) = [e for e in answer.json()["limits"] if e["metric"] == "usd_day"]
    return float(day["used"])


def test_a_provider_batchs_cost_counts_against_the_tenants_budget(world: World) -> None:
    before = spent_today(world)
    done = wait_for(world.client, create(world.client, [line("b1", "budget one")]))
    assert done.status == "completed"
    output = by_custom_id(world.client, done.output_file_id)
    row = ledger(world)[output["b1"]["response"]["request_id"]]
    assert row["BilledCost"] > 0
    until(lambda: spent_today(world) > before)  # charged once the results are stored
    assert spent_today(world) - before == pytest.approx(row["BilledCost"], rel=1e-6)


def test_an_anthropic_batch_comes_back_as_chat_completions(world: World) -> None:
    an, created = world.an, world.an.batch_api.created
    lines = [line(f"a{i}", f"hello {i}", "an-batch") for i in range(3)]
    lines.append(line("a-no", "refuse: please", "an-batch"))
    done = wait_for(world.client, create(world.client, lines))

    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 1)
    assert an.batch_api.created == created + 1
    assert chat_posts(an, "/v1/messages") == 0
    submitted = an.batch_api.requests[list(an.batch_api.batches)[-1]]
    assert [r["params"]["model"] for r in submitted] == ["claude-fake"] * 4
    hello = {"role": "user", "content": [{"type": "text", "text": "hello 0"}]}
    assert submitted[0]["params"]["messages"] == [hello]  # the adapter's own conversion
    assert submitted[0]["params"]["max_tokens"] == 4096  # its default_max_tokens
    output = by_custom_id(world.client, done.output_file_id)
    rows = ledger(world)
    for cid in ("a0", "a1", "a2"):
        body = output[cid]["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == "claude-fake"
        assert body["choices"][0]["message"] == {"role": "assistant", "content": REPLY_TEXT}
        assert body["usage"]["prompt_tokens"] == 11 and body["usage"]["completion_tokens"] == 5
        row = rows[output[cid]["response"]["request_id"]]
        assert (row["provider"], row["prompt_tokens"], row["completion_tokens"]) == ("an", 11, 5)
        assert row["BilledCost"] == pytest.approx(discounted(row), rel=1e-9)
    refused = by_custom_id(world.client, done.error_file_id)["a-no"]["response"]
    assert refused["status_code"] == 400
    assert refused["body"]["error"]["type"] == "invalid_request_error"


def test_a_submit_the_provider_refuses_is_tried_again(world: World) -> None:
    api = world.oa.batch_api
    api.create_failures, created = 2, api.created
    done = wait_for(world.client, create(world.client, [line("r1", "retry me")]))
    assert done.status == "completed" and done.request_counts.completed == 1
    assert api.create_failures == 0 and api.created == created + 1  # refused twice, then one


@pytest.mark.parametrize(
    ("final", "code"), [("failed", "invalid_request"), ("expired", "batch_expired")]
)
def test_the_providers_batch_failing_or_expiring_fails_its_requests(
    world: World, final: str, code: str
) -> None:
    world.oa.batch_api.final_status = final
    done = wait_for(world.client, create(world.client, [line("f1", "a"), line("f2", "b")]))
    assert done.status == "completed" and done.output_file_id is None
    assert (done.request_counts.completed, done.request_counts.failed) == (0, 2)
    errors = by_custom_id(world.client, done.error_file_id)
    assert sorted(errors) == ["f1", "f2"]
    assert {x["error"]["code"] for x in errors.values()} == {code}


@pytest.mark.parametrize(("model", "fake"), [("oa-batch", "oa"), ("an-batch", "an")])
def test_cancel_cancels_the_providers_batch(world: World, model: str, fake: str) -> None:
    api = getattr(world, fake).batch_api
    api.polls_to_complete = 10**9
    created, cancels = api.created, api.cancels
    batch_id = create(world.client, [line("c1", "x", model), line("c2", "y", model)])
    until(lambda: api.created == created + 1)
    world.client.batches.cancel(batch_id)
    done = wait_for(world.client, batch_id)
    assert done.status == "cancelled" and api.cancels == cancels + 1
    errors = by_custom_id(world.client, done.error_file_id)
    assert {x["error"]["code"] for x in errors.values()} == {"batch_cancelled"}


def test_a_restarted_gateway_polls_the_submitted_batch_instead_of_resubmitting(
    world: World,
) -> None:
    api = world.oa.batch_api
    api.polls_to_complete = 10**9
    created = api.created
    folder = world.folder / "restart"
    folder.mkdir()
    (folder / "keys.json").write_bytes((world.folder / "keys.json").read_bytes())
    config = world.config.replace(str(world.folder / "jobs.sqlite3"), str(folder / "jobs.sqlite3"))
    key_client = world.client.api_key
    with running_gateway(config, world.env) as first:
        client = openai.OpenAI(base_url=first.base_url, api_key=key_client, max_retries=0)
        batch_id = create(client, [line("s1", "survive"), line("s2", "restart")])
        until(lambda: api.created == created + 1)
        polls = sum(api.polls.values())
        until(lambda: sum(api.polls.values()) > polls)  # it polls
    api.polls_to_complete = 1
    with running_gateway(config, world.env) as second:
        client = openai.OpenAI(base_url=second.base_url, api_key=key_client, max_retries=0)
        done = wait_for(client, batch_id)
    assert done.status == "completed" and done.request_counts.completed == 2
    assert api.created == created + 1  # polled, never submitted again


@pytest.mark.parametrize("kind", ["gemini", "vllm", "jax"])
def test_batch_api_on_a_provider_kind_without_one_is_a_config_error(kind: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"providers:\n  p: {{type: {kind}, batch_api: true}}\n")
    assert any(e.startswith("providers.p") and "batch_api" in e for e in caught.value.errors)


def test_a_batch_mixing_targets_runs_item_by_item(world: World) -> None:
    created = world.oa.batch_api.created
    chats = chat_posts(world.oa, "/v1/chat/completions")
    done = wait_for(world.client, create(world.client, [line("m1", "a"), line("m2", "b", "plain")]))
    assert done.status == "completed" and done.request_counts.completed == 2
    assert world.oa.batch_api.created == created
    assert chat_posts(world.oa, "/v1/chat/completions") == chats + 2
