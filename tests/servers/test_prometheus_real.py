"""A real Prometheus scraping a real ``switchyard serve`` (an OS process) and a JAX worker
(the worker's HTTP app over a fake engine), evaluating the shipped deploy/prometheus/rules.yml.

The gateway fronts a fake OpenAI upstream (``m-ok`` answers, ``m-server-error`` answers 500)
and the worker; two tenants with API keys send a small load with the official ``openai`` SDK
in two rounds (streams and non-streams, fallbacks, failures, refusals), each round waited
for until Prometheus has scraped it, with a config reload between them. Then, through
Prometheus' HTTP API only: request counts per tenant and status class equal what was sent;
token and cost sums per tenant equal the usage ledger's (``GET /admin/usage``); the failing
target's breaker shows open and its alert is pending; the recording rules evaluate to the
values the load implies; every metric and label name the rules and the dashboard use exists
in the real scrapes; every dashboard query runs and shows data for what the load exercised.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import cast

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from core.config import JaxProviderConfig
from local_tier.jax.api import EngineProtocol
from local_tier.worker.app import create_app as create_worker_app
from local_tier.worker.state import WorkerState
from policies.auth import KeysFile
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import ServerThread, serve
from tests.integration.processes import GatewayProcess
from tests.servers.deploy_files import (
    PROMETHEUS_SERIES,
    ROOT,
    RULES,
    Expr,
    all_exprs,
    family_of,
    grafana_to_promql,
    grouping_labels,
    is_recorded,
    load_dashboard,
    load_rules,
    matcher_labels,
    metric_names,
    recorded_names,
    variable_queries,
)
from tests.servers.prometheus import Prometheus, needs_prometheus, wait_for
from tests.unit.jax_fake import FakeEngine

pytestmark = [pytest.mark.servers, needs_prometheus, pytest.mark.timeout(120)]

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


@pytest.fixture(scope="module")
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
        if number == 1:
            answer = admin(world.gateway, "POST", "/admin/reload")
            assert answer.status_code == 200, answer.text


def _scraped(prometheus: Prometheus, requests: int) -> bool | None:
    """True once Prometheus' last scrape of the gateway counts ``requests`` requests."""
    return True if prometheus.scalar("sum(switchyard_requests_total)") == requests else None


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
def test_request_counts_per_tenant_and_status_equal_the_load(world: World) -> None:
    sent = Counter((call.tenant or "none", call.status) for call in ROUND * ROUNDS)
    counted = world.prometheus.values(
        "sum by (tenant, status_class) (switchyard_requests_total)", "tenant", "status_class"
    )
    assert counted == {key: float(count) for key, count in sent.items()}


def test_token_and_cost_sums_equal_the_usage_ledger(world: World) -> None:
    prometheus = world.prometheus
    columns = {
        "prompt_tokens": 'sum by (tenant) (switchyard_tokens_total{type="prompt"})',
        "completion_tokens": 'sum by (tenant) (switchyard_tokens_total{type="completion"})',
    }
    counted = {column: by_tenant(prometheus, promql) for column, promql in columns.items()}
    assert set(counted["prompt_tokens"]) == {"acme", "beta"}

    def settled() -> list[dict[str, object]] | None:
        rows = ledger_rows(world.gateway)
        same = all(ledger_sums(rows, column) == counted[column] for column in columns)
        return rows if same else None

    rows = wait_for("the ledger's token sums to equal Prometheus'", settled, 10)
    cost = by_tenant(prometheus, "sum by (tenant) (switchyard_cost_usd_total)")
    billed = ledger_sums(rows, "BilledCost")
    assert set(cost) == set(billed) == {"acme", "beta"}
    for tenant, usd in billed.items():
        assert cost[tenant] == pytest.approx(usd, rel=1e-9)


def test_the_failing_targets_breaker_shows_open(world: World) -> None:
    prometheus = world.prometheus
    open_now = prometheus.values('switchyard_breaker_state{state="open"}', "target")
    assert open_now[(FAILING,)] == 1.0
    assert open_now[("oa/m-ok",)] == 0.0
    moves = prometheus.values(
        "sum by (target, to) (switchyard_breaker_transitions_total)", "target", "to"
    )
    assert moves == {(FAILING, "open"): 1.0}
    # only round 1's two flaky requests fell back; after that the open breaker skips the target
    fallbacks = prometheus.values(
        "sum by (from_target, reason) (switchyard_fallbacks_total)", "from_target", "reason"
    )
    assert fallbacks == {(FAILING, "UpstreamServerError"): 2.0}


def test_goodput_reload_and_local_tier_series(world: World) -> None:
    prometheus = world.prometheus
    goodput = prometheus.values(
        "sum by (model, slo) (switchyard_goodput_requests_total)", "model", "slo"
    )
    streams_with_objective = sum(1 for c in ROUND if c.model == "chat" and c.slo_ms) * ROUNDS
    assert goodput[("chat", "met")] == streams_with_objective
    assert ("chat", "missed") not in goodput
    assert goodput[("strict", "missed")] == sum(1 for c in ROUND if c.model == "strict") * ROUNDS
    reloads = prometheus.values("switchyard_config_reloads_total", "outcome")
    assert reloads == {("applied",): 1.0, ("rejected",): 0.0, ("failed",): 0.0}
    local = f"jw/{WORKER_MODEL}"
    assert prometheus.values("switchyard_replica_saturated", "target") == {(local,): 0.0}
    assert (local,) in prometheus.values("switchyard_replica_kv_cache_usage_ratio", "target")
    finished = prometheus.scalar("sum(vllm:request_success_total)")
    assert finished == sum(1 for c in ROUND if c.model == "local") * ROUNDS


# ---------------------------------------------------------------------------- the rules
def test_the_recording_rules_and_alerts_evaluate_on_real_data(world: World) -> None:
    prometheus = world.prometheus

    def miss_ratios() -> dict[tuple[str, ...], float] | None:
        found = prometheus.values("switchyard:slo_miss_ratio:rate5m", "model")
        return found if {("strict",), ("chat",)} <= set(found) else None

    ratios = wait_for("switchyard:slo_miss_ratio:rate5m for strict and chat", miss_ratios, 15)
    assert ratios[("strict",)] == 1.0  # every request with strict's objective missed it
    assert ratios[("chat",)] == 0.0  # chat's streams with a 60 s objective all met it
    rules = [rule for group in prometheus.api("rules")["groups"] for rule in group["rules"]]
    assert len(rules) == sum(len(group["rules"]) for group in load_rules()["groups"])
    broken = [(rule["name"], rule.get("lastError")) for rule in rules if rule["health"] != "ok"]
    assert not broken

    def alerts() -> set[tuple[str, str]] | None:
        found = {
            (
                alert["labels"]["alertname"],
                alert["labels"].get("target") or alert["labels"].get("model", ""),
            )
            for alert in prometheus.api("alerts")["alerts"]
        }
        wanted = {("SwitchyardBreakerOpen", FAILING), ("SwitchyardSLOBurnFast", "strict")}
        return found if wanted <= found else None

    active = wait_for("the breaker-open and SLO-burn alerts to be pending", alerts, 15)
    assert ("SwitchyardBreakerOpen", "oa/m-ok") not in active
    assert ("SwitchyardSLOBurnFast", "chat") not in active


# ---------------------------------------------------------------------------- names in deploy/
def scraped_families(prometheus: Prometheus) -> dict[str, dict[str, str]]:
    """Per job, every metric family the last scrape exposed (with or without samples) and
    its type, from Prometheus' target metadata."""
    families: dict[str, dict[str, str]] = {GATEWAY_JOB: {}, WORKER_JOB: {}}
    for entry in prometheus.api("targets/metadata"):
        families[entry["target"]["job"]][entry["metric"]] = entry["type"]
    return families


def test_every_metric_name_in_the_rules_and_dashboard_is_in_a_real_scrape(world: World) -> None:
    families = scraped_families(world.prometheus)
    recorded = recorded_names(load_rules())
    missing = []
    for expr in all_exprs():
        for name in metric_names(expr.promql):
            if name in PROMETHEUS_SERIES:
                continue
            if is_recorded(name):
                if name not in recorded:
                    missing.append((expr.where, name, "not recorded by rules.yml"))
                continue
            job = WORKER_JOB if name.startswith("vllm:") else GATEWAY_JOB
            histograms = {n for n, kind in families[job].items() if kind == "histogram"}
            if family_of(name, histograms) not in families[job]:
                missing.append((expr.where, name, f"not in the {job} scrape"))
    assert not missing


def test_every_scraped_family_is_documented(world: World) -> None:
    """docs/metrics.md names (in backticks) every family the gateway and the worker expose,
    but prometheus_client's ``<name>_created`` companions."""
    docs = (ROOT / "docs" / "metrics.md").read_text()
    undocumented = []
    for job, families in scraped_families(world.prometheus).items():
        for name in families:
            base = name.removesuffix("_created")
            if base != name and ({base, base + "_total"} & set(families)):
                continue
            if f"`{name}`" not in docs:
                undocumented.append((job, name))
    assert not undocumented


def label_names(prometheus: Prometheus, name: str) -> set[str]:
    """The label names on ``name``'s series now (empty: it has none)."""
    return set(prometheus.api("labels", **{"match[]": name}))


def test_every_name_has_series_and_every_label_used_exists(world: World) -> None:
    """Names outside NO_TRAFFIC have series under this load; a selector's matchers and an
    expression's grouping labels name labels its series carry."""
    prometheus = world.prometheus
    labels = {
        name: label_names(prometheus, name)
        for expr in all_exprs()
        for name in metric_names(expr.promql)
    }
    without = {name for name, found in labels.items() if not found}
    assert without == NO_TRAFFIC
    wrong = []
    for expr in all_exprs():
        wrong.extend(_unknown_labels(expr, labels))
    assert not wrong


def _unknown_labels(expr: Expr, labels: dict[str, set[str]]) -> list[tuple[str, str, str]]:
    names = metric_names(expr.promql)
    if any(not labels[name] for name in names):
        return []  # a name without series yet: nothing to compare with
    out = [
        (expr.where, name, label)
        for name, used in matcher_labels(expr.promql).items()
        for label in used - labels[name]
    ]
    carried = set().union(*(labels[name] for name in names)) if names else set()
    out.extend((expr.where, "by/on", label) for label in grouping_labels(expr.promql) - carried)
    return out


def test_every_dashboard_query_runs_and_shows_the_load(world: World) -> None:
    """Each panel query, with every variable on All, is valid PromQL to the real server and
    returns samples unless it reads only what the load does not exercise; each template
    variable lists values."""
    prometheus = world.prometheus
    empty = []
    for panel_expr in [e for e in all_exprs() if e.where.startswith("dashboard '")]:
        names = metric_names(panel_expr.promql)
        result = prometheus.query(grafana_to_promql(panel_expr.promql))
        if not result and not names & NO_TRAFFIC:
            empty.append(panel_expr.where)
    assert not empty
    for variable, metric, label in variable_queries(load_dashboard()):
        values = prometheus.api(f"label/{label}/values", **{"match[]": metric})
        assert values, variable


def test_the_scrape_has_no_duplicate_series(world: World) -> None:
    """The text format allows one sample per name and label set; Prometheus drops repeats
    silently (so a sum over them would hide nothing, but other scrapers reject the body)."""
    body = httpx.get(world.gateway.url + "/metrics", timeout=10).text
    seen: Counter[tuple[str, frozenset[tuple[str, str]]]] = Counter()
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            seen[(sample.name, frozenset(sample.labels.items()))] += 1
    repeated = sorted({name for (name, _), count in seen.items() if count > 1})
    assert not repeated, f"series exposed more than once: {repeated}"
