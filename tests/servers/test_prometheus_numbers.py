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

from collections import Counter

import pytest

from tests.servers.deploy_files import (
    load_rules,
)
from tests.servers.prometheus import needs_prometheus, wait_for
from tests.servers.world import (
    FAILING,
    ROUND,
    ROUNDS,
    WORKER_MODEL,
    World,
    by_tenant,
    ledger_rows,
    ledger_sums,
)

pytestmark = [pytest.mark.servers, needs_prometheus, pytest.mark.timeout(120)]


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
