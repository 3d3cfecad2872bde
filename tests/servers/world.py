"""The world the real-Prometheus tests share (one per test session, built once): a real
``switchyard serve`` in front of a fake OpenAI upstream and a JAX worker over a fake engine,
a real Prometheus scraping both and evaluating deploy/prometheus/rules.yml, and a small
load sent in two rounds with the official ``openai`` SDK (see ``test_prometheus_numbers``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import cast

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from core.config import JaxProviderConfig
from local_tier.jax.api import EngineProtocol
from local_tier.worker.app import create_app as create_worker_app
from local_tier.worker.state import WorkerState
from policies.auth import KeysFile
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import ServerThread, serve
from tests.integration.processes import GatewayProcess
from tests.servers.deploy_files import (
    RULES,
)
from tests.servers.prometheus import Prometheus, wait_for
from tests.unit.jax_fake import FakeEngine

ADMIN = "sy-admin-prometheus-0123456789"
GATEWAY_JOB, WORKER_JOB = "switchyard", "switchyard-workers"
WORKER_MODEL = "fake-model"
FAILING = "oa/m-server-error"
SLO_HEADER = "x-switchyard-slo-ttft-ms"
# Names the load does not exercise (no admission queue wait, hedge, retry, quota refusal or
# response cache hit): they must exist in the scrape, but have no series yet. (Prompt cache
# hits do happen: the fake engine reports the local alias's repeated prompt as cached.)
NO_TRAFFIC = frozenset(
    {
        "switchyard_queue_rejections_total",
        "switchyard_queue_wait_seconds_bucket",
        "switchyard_hedges_total",
        "switchyard_hedge_cost_usd_total",
        "switchyard_retries_total",
        "switchyard_quota_rejections_total",
        "switchyard_response_cache_hits_total",
        "switchyard:queue_rejections:rate5m",
    }
)


@dataclass(frozen=True)
class Call:
    """One request of the load: who sends it (None: a key nobody issued), to which alias,
    how, and the status class it must get."""

    tenant: str | None
    model: str
    status: str = "2xx"
    stream: bool = False
    slo_ms: str | None = None


# One round; the load is two. acme's two `flaky` requests fail on oa/m-server-error and fall
# back to oa/m-ok: the breaker (2 consecutive failures) opens, so every later request to
# `broken` (its only target is oa/m-server-error) is refused 503 without an upstream call.
ROUND = (
    Call("acme", "flaky"),
    Call("acme", "flaky"),
    Call("acme", "chat"),
    Call("acme", "chat"),
    Call("acme", "chat", stream=True, slo_ms="60000"),  # TTFT objective met
    Call("acme", "strict"),  # strict's 1 microsecond objective: missed
    Call("acme", "strict", stream=True),
    Call("beta", "chat"),
    Call("beta", "chat", stream=True, slo_ms="60000"),
    Call("beta", "local"),
    Call("beta", "local", stream=True),
    Call("beta", "broken", status="5xx"),
    Call("beta", "broken", status="5xx"),
    Call("beta", "no-such-model", status="4xx"),
    Call(None, "chat", status="4xx"),
)
ROUNDS = 2


@dataclass
class World:
    prometheus: Prometheus
    gateway: GatewayProcess


def config_text(upstream: str, worker: str, folder: Path) -> str:
    return f"""
auth: {{admin_key_env: T_ADMIN, keys_file: {folder / "keys.json"}}}
tenants:
  acme: {{limits: {{rpm: 10000}}}}
  beta: {{limits: {{rpm: 10000}}}}
ledger: {{path: {folder / "usage.sqlite3"}}}
routing:
  max_attempts_per_target: 1
  breaker: {{consecutive_failures: 2, min_calls: 2, failure_rate: 1.0, window_s: 60,
            cooldown_s: 600}}
providers:
  oa: {{type: openai, base_url: "{upstream}/v1"}}
  jw: {{type: vllm, base_url: "{worker}/v1"}}
models:
  chat:
    targets:
      - {{provider: oa, model: m-ok, price: {{input_per_mtok: 1.0, output_per_mtok: 2.0}}}}
  strict: {{slo_ttft_ms: 0.001, targets: [{{provider: oa, model: m-ok}}]}}
  flaky: {{targets: [{{provider: oa, model: m-server-error}}, {{provider: oa, model: m-ok}}]}}
  broken: {{targets: [{{provider: oa, model: m-server-error}}]}}
  local:
    targets:
      - {{provider: jw, model: {WORKER_MODEL}, price: {{input_per_mtok: 0.5, output_per_mtok: 0.5}}}}
"""


def start_worker(stack: ExitStack) -> ServerThread:
    """The JAX worker's HTTP app over a fake engine, serving vLLM's series at /metrics."""
    engine = FakeEngine(reply="Hello from the local tier.", max_model_len=256)

    async def load(_: JaxProviderConfig) -> EngineProtocol:
        return cast(EngineProtocol, engine)  # FakeEngine implements the protocol

    config = JaxProviderConfig(served_model_name=WORKER_MODEL, max_model_len=256)
    server = stack.enter_context(serve(create_worker_app(WorkerState(config, load))))
    wait_for("the worker to load its engine", lambda: _healthy(server.url + "/health"), 10)
    return server


def _healthy(url: str) -> bool | None:
    try:
        return True if httpx.get(url, timeout=1).status_code == 200 else None
    except httpx.TransportError:
        return None


@pytest.fixture(scope="package")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("prometheus-real")
    keys = KeysFile(folder / "keys.json")
    secrets = {tenant: keys.create(tenant, "ci")[0] for tenant in ("acme", "beta")}
    with ExitStack() as stack:
        upstream = stack.enter_context(serve(FakeOpenAI()))
        worker = start_worker(stack)
        config = folder / "switchyard.yaml"
        config.write_text(config_text(upstream.url, worker.url, folder))
        gateway = GatewayProcess(config, {"T_ADMIN": ADMIN}, folder / "gateway.log")
        stack.enter_context(gateway)
        jobs = {
            GATEWAY_JOB: [f"127.0.0.1:{gateway.port}"],
            WORKER_JOB: [f"127.0.0.1:{worker.port}"],
        }
        prometheus = Prometheus(folder, jobs, [RULES])
        stack.callback(prometheus.stop)
        prometheus.start()
        world = World(prometheus, gateway)
        run_load(world, secrets)
        yield world


# ---------------------------------------------------------------------------- the load
def run_load(world: World, secrets: dict[str, str]) -> None:
    """Both rounds, each waited for until Prometheus has scraped all of it; a config reload
    between them. Rates in the rules need a series' first sample before its increase."""
    prometheus = world.prometheus
    wait_for("both scrape targets up", lambda: _all_up(prometheus))
    for number in range(1, ROUNDS + 1):
        for call in ROUND:
            send(world.gateway, secrets, call)
        sent = number * len(ROUND)
        wait_for(f"Prometheus to scrape round {number}", partial(_scraped, prometheus, sent))
        scraped_at = _last_scrape(prometheus)
        wait_for(
            f"the rules to evaluate round {number}", partial(_evaluated, prometheus, scraped_at)
        )
        if number == 1:
            answer = admin(world.gateway, "POST", "/admin/reload")
            assert answer.status_code == 200, answer.text


def _scraped(prometheus: Prometheus, requests: int) -> bool | None:
    """True once Prometheus' last scrape of the gateway counts ``requests`` requests."""
    return True if prometheus.scalar("sum(switchyard_requests_total)") == requests else None


def _last_scrape(prometheus: Prometheus) -> str:
    """When Prometheus last scraped the gateway (RFC 3339, as the targets API says)."""
    targets = prometheus.api("targets")["activeTargets"]
    return str(next(t["lastScrape"] for t in targets if t["labels"]["job"] == GATEWAY_JOB))


def _evaluated(prometheus: Prometheus, scraped_at: str) -> bool | None:
    """True once every rule group has been evaluated after ``scraped_at``: a recorded series
    lags the scrape it reads by up to one evaluation interval (a test that read it at once
    found none)."""
    groups = prometheus.api("rules")["groups"]
    return True if all(_later(g["lastEvaluation"], scraped_at) for g in groups) else None


def _later(stamp: str, than: str) -> bool:
    return datetime.fromisoformat(stamp) > datetime.fromisoformat(than)


def _all_up(prometheus: Prometheus) -> bool | None:
    up = prometheus.values("up", "job")
    return True if up == {(GATEWAY_JOB,): 1.0, (WORKER_JOB,): 1.0} else None


def send(gateway: GatewayProcess, secrets: dict[str, str], call: Call) -> None:
    """Send ``call`` with the official SDK; its status class must be the expected one."""
    key = secrets[call.tenant] if call.tenant else "sk-nobody-issued-this-key"
    client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=30)
    headers = {SLO_HEADER: call.slo_ms} if call.slo_ms else None
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello"}]
    try:
        if call.stream:
            with client.chat.completions.create(
                model=call.model, messages=messages, stream=True, extra_headers=headers
            ) as stream:
                chunks = list(stream)  # read to the end: a stream left early is a disconnect
            assert any(chunk.choices for chunk in chunks)
        else:
            client.chat.completions.create(
                model=call.model, messages=messages, extra_headers=headers
            )
        status = 200
    except openai.APIStatusError as error:
        status = error.status_code
    assert f"{status // 100}xx" == call.status, (call, status)


def admin(gateway: GatewayProcess, method: str, path: str, **params: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {ADMIN}"}
    return httpx.request(method, gateway.url + path, params=params, headers=headers, timeout=10)


def ledger_rows(gateway: GatewayProcess) -> list[dict[str, object]]:
    answer = admin(gateway, "GET", "/admin/usage", format="jsonl")
    assert answer.status_code == 200, answer.text
    return [json.loads(line) for line in answer.text.splitlines() if line.strip()]


def ledger_sums(rows: list[dict[str, object]], column: str) -> dict[str, float]:
    """Per tenant (``SubAccountId``), the sum of ``column``, tenants summing to 0 left out."""
    sums: defaultdict[str, float] = defaultdict(float)
    for row in rows:
        sums[str(row["SubAccountId"])] += float(str(row[column]))
    return {tenant: total for tenant, total in sums.items() if total}


def by_tenant(prometheus: Prometheus, promql: str) -> dict[str, float]:
    return {key[0]: value for key, value in prometheus.values(promql, "tenant").items() if value}


# ---------------------------------------------------------------------------- the numbers
