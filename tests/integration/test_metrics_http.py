"""``GET /metrics`` over real HTTP: the series match what the requests did and what the
usage ledger holds (tokens, cost), refusals are counted by gate, fallbacks by reason, and
label values stay bounded (an unknown alias is ``unknown``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from policies.auth import KeysFile
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-metrics-0123456789"
USER = [{"role": "user", "content": "Say hello"}]


@dataclass
class World:
    gateway: Gateway
    acme: str  # acme's API key (generous limits)
    tiny: str  # tiny's API key (2 requests per minute)
    folder: Path


def config_text(upstream: str, folder: Path, metrics: str = "{}") -> str:
    return f"""
auth: {{admin_key_env: T_ADMIN, keys_file: {folder / "keys.json"}}}
tenants:
  acme: {{limits: {{rpm: 1000}}}}
  tiny: {{limits: {{rpm: 2}}}}
ledger: {{path: {folder / "usage.sqlite3"}}}
routing: {{max_attempts_per_target: 1}}
observability: {{metrics: {metrics}}}
providers:
  oa: {{type: openai, base_url: "{upstream}/v1"}}
models:
  chat:
    targets:
      - {{provider: oa, model: m-ok, price: {{input_per_mtok: 1.0, output_per_mtok: 2.0}}}}
  flaky: {{targets: [{{provider: oa, model: m-server-error}}, {{provider: oa, model: m-ok}}]}}
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("metrics")
    keys = KeysFile(folder / "keys.json")
    acme, _ = keys.create("acme", "ci")
    tiny, _ = keys.create("tiny", "ci")
    upstream = FakeOpenAI()
    with (
        serve(upstream) as up,
        running_gateway(config_text(up.url, folder), {"T_ADMIN": ADMIN}) as gateway,
    ):
        yield World(gateway, acme, tiny, folder)


def scrape(gateway: Gateway, **headers: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of one scrape, keyed by (name, labels)."""
    answer = httpx.get(gateway.url + "/metrics", headers=headers, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def total(samples: dict, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def client(gateway: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)


def ledger_rows(gateway: Gateway, tenant: str) -> list[dict]:
    answer = httpx.get(
        gateway.url + "/admin/usage",
        params={"tenant": tenant, "format": "jsonl"},
        headers={"authorization": f"Bearer {ADMIN}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    return [json.loads(line) for line in answer.text.splitlines() if line.strip()]


def test_requests_tokens_and_cost_match_the_ledger(world: World) -> None:
    acme = client(world.gateway, world.acme)
    for _ in range(3):
        acme.chat.completions.create(model="chat", messages=USER)
    with acme.chat.completions.create(model="chat", messages=USER, stream=True) as stream:
        assert any(chunk.choices for chunk in stream)
    samples = scrape(world.gateway)
    ok = {"model": "chat", "tenant": "acme", "status_class": "2xx"}
    assert total(samples, "switchyard_requests_total", **ok, target="oa/m-ok") == 4
    rows = ledger_rows(world.gateway, "acme")
    chat_rows = [r for r in rows if r["model"] == "chat"]
    assert len(chat_rows) == 4
    for kind, column in (("prompt", "prompt_tokens"), ("completion", "completion_tokens")):
        counted = total(samples, "switchyard_tokens_total", tenant="acme", model="chat", type=kind)
        assert counted == sum(r[column] for r in chat_rows) > 0
    cost = total(samples, "switchyard_cost_usd_total", tenant="acme", model="chat")
    assert cost == pytest.approx(sum(float(r["BilledCost"]) for r in chat_rows), rel=1e-6)
    assert cost > 0
    # one TTFT sample for the stream; one overhead sample per success; one attempt each
    ttft = "gen_ai_server_time_to_first_token_seconds_count"
    assert total(samples, ttft, gen_ai_request_model="chat") == 1
    assert total(samples, "switchyard_gateway_overhead_seconds_count", endpoint="chat") >= 4
    attempts = "gen_ai_client_operation_duration_seconds_count"
    assert total(samples, attempts, target="oa/m-ok", error_type="") >= 4
    assert total(samples, "gen_ai_client_token_usage_count", gen_ai_token_type="input") >= 4


def test_a_fallback_is_counted_with_its_reason(world: World) -> None:
    before = scrape(world.gateway)
    client(world.gateway, world.acme).chat.completions.create(model="flaky", messages=USER)
    after = scrape(world.gateway)
    labels = {"model": "flaky", "from_target": "oa/m-server-error"}
    moved = total(after, "switchyard_fallbacks_total", **labels, reason="UpstreamServerError")
    assert moved - total(before, "switchyard_fallbacks_total", **labels) == 1
    failed = "gen_ai_client_operation_duration_seconds_count"
    grew = total(after, failed, error_type="UpstreamServerError") - total(
        before, failed, error_type="UpstreamServerError"
    )
    assert grew == 1
    # the breaker gauge is one-hot per target
    target = "oa/m-server-error"
    states = [total(after, "switchyard_breaker_state", target=target, state=s) for s in
              ("closed", "open", "half_open")]  # fmt: skip
    assert sorted(states) == [0.0, 0.0, 1.0]


def test_a_quota_refusal_is_counted_by_limit_and_leaves_no_row(world: World) -> None:
    tiny = client(world.gateway, world.tiny)
    tiny.chat.completions.create(model="chat", messages=USER)
    tiny.chat.completions.create(model="chat", messages=USER)
    with pytest.raises(openai.RateLimitError):
        tiny.chat.completions.create(model="chat", messages=USER)
    samples = scrape(world.gateway)
    refused = total(samples, "switchyard_quota_rejections_total", tenant="tiny", limit="requests")
    assert refused == 1
    assert total(samples, "switchyard_requests_total", tenant="tiny", status_class="4xx") == 1
    assert len(ledger_rows(world.gateway, "tiny")) == 2
    errors = total(samples, "switchyard_request_errors_total", error="rate_limit_exceeded")
    assert errors >= 1


def test_an_unknown_alias_is_labelled_unknown(world: World) -> None:
    acme = client(world.gateway, world.acme)
    for name in ("no-such-model-1", "no-such-model-2"):
        with pytest.raises(openai.NotFoundError):
            acme.chat.completions.create(model=name, messages=USER)
    samples = scrape(world.gateway)
    assert total(samples, "switchyard_requests_total", model="unknown", status_class="4xx") == 2
    assert not [labels for (_, labels) in samples if ("model", "no-such-model-1") in labels]


def test_process_gauges_are_present(world: World) -> None:
    samples = scrape(world.gateway)
    names = {name for name, _ in samples}
    for name in (
        "switchyard_requests_in_flight",
        "switchyard_queue_depth",
        "switchyard_target_in_flight",
        "switchyard_ledger_pending_commits",
    ):
        assert name in names
    # the scrape itself is not a request through the pipeline
    assert total(samples, "switchyard_requests_in_flight") == 0


def test_metrics_can_require_the_admin_key_or_be_off(tmp_path: Path) -> None:
    KeysFile(tmp_path / "keys.json")
    with serve(FakeOpenAI()) as up:
        guarded = config_text(up.url, tmp_path, "{require_admin: true}")
        with running_gateway(guarded, {"T_ADMIN": ADMIN}) as gateway:
            assert httpx.get(gateway.url + "/metrics").status_code == 401
            assert scrape(gateway, authorization=f"Bearer {ADMIN}")
        off = config_text(up.url, tmp_path, "{enabled: false}")
        with running_gateway(off, {"T_ADMIN": ADMIN}) as gateway:
            assert httpx.get(gateway.url + "/metrics").status_code == 404
