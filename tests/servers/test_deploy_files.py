"""The shipped monitoring files without any server (so this module runs in every stage, not
only ``servers``): the Grafana dashboard is importable JSON that covers what the issue asks
for, every alert is labelled and annotated, recorded names resolve, and the PromQL name
extraction the real-Prometheus tests rely on finds exactly the names in known expressions."""

from __future__ import annotations

from typing import Any

import yaml

from tests.servers.deploy_files import (
    EXAMPLE_CONFIG,
    RULES_TEST,
    all_exprs,
    dashboard_exprs,
    grafana_to_promql,
    grouping_labels,
    is_recorded,
    load_dashboard,
    load_rules,
    matcher_labels,
    metric_names,
    panels_of,
    recorded_names,
    rules_of,
    variable_queries,
)

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PANEL_TYPES = {"row", "timeseries", "stat", "state-timeline"}


# ---------------------------------------------------------------------------- extraction
def test_metric_names_are_the_selected_series_only() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, gen_ai_request_model) (rate("
        'gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_request_model=~"$model", '
        'target="a{b}"}[$__rate_interval])))'
    )
    assert metric_names(expr) == {"gen_ai_server_time_to_first_token_seconds_bucket"}
    assert matcher_labels(expr) == {
        "gen_ai_server_time_to_first_token_seconds_bucket": {"gen_ai_request_model", "target"}
    }
    assert grouping_labels(expr) == {"le", "gen_ai_request_model"}
    ratio = (
        "switchyard:error_ratio:rate5m > 0.05\nand on (model) sum by (model) "
        "(rate(switchyard_requests_total[5m])) > 0.1"
    )
    assert metric_names(ratio) == {"switchyard:error_ratio:rate5m", "switchyard_requests_total"}
    assert grouping_labels(ratio) == {"model"}
    assert metric_names(
        "time() - max(switchyard_config_last_reload_success_timestamp_seconds)"
    ) == {"switchyard_config_last_reload_success_timestamp_seconds"}
    assert metric_names("vector(500)") == set()
    assert metric_names("switchyard:slo_miss_ratio:rate1h > (14.4 * 0.01)") == {
        "switchyard:slo_miss_ratio:rate1h"
    }
    assert metric_names("sum(vllm:num_requests_running) by (instance)") == {
        "vllm:num_requests_running"
    }
    assert is_recorded("switchyard:cost_usd:rate1h")
    assert not is_recorded("vllm:kv_cache_usage_perc")


def test_grafana_variables_become_match_all_regexes() -> None:
    expr = 'sum(rate(x{model=~"$model", tenant=~"${tenant}"}[$__rate_interval]))'
    assert grafana_to_promql(expr) == 'sum(rate(x{model=~".*", tenant=~".*"}[1m]))'


# ---------------------------------------------------------------------------- dashboard
def test_the_dashboard_is_grafana_json_with_a_datasource_variable() -> None:
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] == 39
    assert dashboard["uid"] and dashboard["title"] == "Switchyard"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {name for name, _, _ in variable_queries(dashboard)} == {"model", "tenant", "target"}
    for name in ("model", "tenant", "target"):
        assert variables[name]["datasource"] == DATASOURCE
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"


def test_every_panel_reads_the_datasource_variable_and_has_a_place() -> None:
    panels = panels_of(load_dashboard())
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel["type"] in PANEL_TYPES, panel["title"]
        _place(panel, cells)
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE and target["expr"].strip(), panel["title"]


def _place(panel: dict[str, Any], cells: set[tuple[int, int]]) -> None:
    """Claim the panel's grid cells: inside the 24 columns, overlapping no other panel."""
    grid = panel["gridPos"]
    assert grid["x"] >= 0 and grid["y"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
    mine = {
        (x, y)
        for x in range(grid["x"], grid["x"] + grid["w"])
        for y in range(grid["y"], grid["y"] + grid["h"])
    }
    assert not mine & cells, f"{panel['title']} overlaps another panel"
    cells.update(mine)


def test_the_dashboard_covers_what_operators_need() -> None:
    """Traffic, errors, latency and TTFT, time per output token, cost per tenant and
    target, tokens, fallbacks and retries, breakers, queue, local replicas (the gateway's
    view and the workers' own vLLM series, phases included), overhead, goodput, reloads."""
    used = set().union(*(metric_names(e.promql) for e in dashboard_exprs(load_dashboard())))
    wanted = {
        "switchyard_requests_total",
        "switchyard_request_errors_total",
        "gen_ai_server_request_duration_seconds_bucket",
        "gen_ai_server_time_to_first_token_seconds_bucket",
        "gen_ai_server_time_per_output_token_seconds_bucket",
        "switchyard_cost_usd_total",
        "switchyard_tokens_total",
        "switchyard_fallbacks_total",
        "switchyard_retries_total",
        "switchyard_breaker_state",
        "switchyard_queue_depth",
        "switchyard_queue_rejections_total",
        "switchyard_replica_saturated",
        "switchyard_replica_kv_cache_usage_ratio",
        "switchyard_replica_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:request_queue_time_seconds_bucket",
        "vllm:request_prefill_time_seconds_bucket",
        "vllm:request_decode_time_seconds_bucket",
        "vllm:request_inference_time_seconds_bucket",
        "vllm:request_time_per_output_token_seconds_bucket",
        "switchyard_gateway_overhead_seconds_bucket",
        "switchyard_goodput_requests_total",
        "switchyard_config_reloads_total",
    }
    assert wanted <= used, wanted - used


# ---------------------------------------------------------------------------- rules
def test_every_alert_has_a_severity_a_summary_and_a_description() -> None:
    alerts = [rule for rule in rules_of(load_rules()) if "alert" in rule]
    for alert in alerts:
        assert alert["labels"]["severity"] in {"critical", "warning"}, alert["alert"]
        assert alert["annotations"]["summary"].strip(), alert["alert"]
        assert alert["annotations"]["description"].strip(), alert["alert"]
    names = {alert["alert"] for alert in alerts}
    assert {
        "SwitchyardHighErrorRatio",
        "SwitchyardBreakerOpen",
        "SwitchyardQueueRejecting",
        "SwitchyardQueueBacklog",
        "SwitchyardSpendBurnFast",
        "SwitchyardSpendOverBudget",
        "SwitchyardSLOBurnFast",
        "SwitchyardSLOBurnSlow",
    } <= names


def test_recorded_names_are_recorded_and_follow_the_naming_convention() -> None:
    recorded = recorded_names(load_rules())
    for name in recorded:
        assert name.startswith("switchyard:") and name.count(":") == 2, name
    used = {(e.where, n) for e in all_exprs() for n in metric_names(e.promql) if is_recorded(n)}
    assert used, "nothing reads a recorded series"
    assert not {(where, name) for where, name in used if name not in recorded}


def test_the_rule_unit_tests_cover_the_breaker_and_error_ratio_alerts() -> None:
    tests = yaml.safe_load(RULES_TEST.read_text())
    assert tests["rule_files"] == ["rules.yml"]
    pinned = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case["exp_alerts"]
    }
    assert {"SwitchyardBreakerOpen", "SwitchyardHighErrorRatio"} <= pinned


def test_the_example_config_scrapes_gateways_and_workers_with_the_rules() -> None:
    config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    assert config["rule_files"] == ["rules.yml"]
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert jobs == {"switchyard", "switchyard-workers"}
