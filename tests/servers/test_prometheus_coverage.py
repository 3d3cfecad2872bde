"""What the shipped rules and dashboard name exists in real scrapes (the gateway's and the
JAX worker's), every scraped family is documented in docs/metrics.md, every label a query
uses exists, every dashboard query runs and shows the load, and no series is repeated.
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.servers.deploy_files import (
    PROMETHEUS_SERIES,
    ROOT,
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
from tests.servers.prometheus import Prometheus, needs_prometheus
from tests.servers.world import GATEWAY_JOB, NO_TRAFFIC, WORKER_JOB, World

pytestmark = [pytest.mark.servers, needs_prometheus, pytest.mark.timeout(120)]


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
