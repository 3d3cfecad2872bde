"""The shipped monitoring files (deploy/) as data: every PromQL expression in the rules and
the Grafana dashboard, and the metric and label names an expression reads.

The name extraction is lexical, not a PromQL parser: it removes string literals, Grafana
variables, range selectors, label matchers and grouping clauses, then takes every remaining
identifier that is not a function call or a keyword. That is exact for the expressions the
deploy files use (tests/servers/test_deploy_files.py pins it on examples)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"
RULES_TEST = DEPLOY / "prometheus" / "rules_test.yml"
EXAMPLE_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "switchyard.json"

# Series Prometheus makes itself (not in any scrape's body).
PROMETHEUS_SERIES = frozenset({"up"})
KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan", "atan2"}
)

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_SELECTOR = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)\s*\{([^}]*)\}")
_MATCHER_LABEL = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
_MATCHERS = re.compile(r"\{[^}]*\}")
_IDENTIFIER = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*(\w+)\s*\)\s*$")
_HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


@dataclass(frozen=True)
class Expr:
    """One PromQL expression and where it is (for failure messages)."""

    where: str
    promql: str


def _strip(promql: str) -> str:
    """``promql`` without string literals, Grafana variables and range selectors."""
    text = _STRING.sub('""', promql)
    text = _VARIABLE.sub("", text)
    return _RANGE.sub("", text)


def metric_names(promql: str) -> set[str]:
    """The metric names (raw or recorded) that ``promql`` selects."""
    text = _GROUPING.sub(" ", _MATCHERS.sub(" ", _strip(promql)))
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name, call = match.group(1), match.group(2)
        if call is None and name not in KEYWORDS:
            names.add(name)
    return names


def matcher_labels(promql: str) -> dict[str, set[str]]:
    """Per metric name, the label names its selectors match on (``name{label="..."}``)."""
    found: dict[str, set[str]] = {}
    for match in _SELECTOR.finditer(_strip(promql)):
        labels = set(_MATCHER_LABEL.findall(match.group(2)))
        found.setdefault(match.group(1), set()).update(labels)
    return found


def grouping_labels(promql: str) -> set[str]:
    """The label names in ``by``/``without``/``on``/``ignoring``/``group_*`` clauses."""
    labels: set[str] = set()
    for match in _GROUPING.finditer(_strip(promql)):
        labels.update(part.strip() for part in match.group(1).split(",") if part.strip())
    return labels


def family_of(name: str, histograms: set[str]) -> str:
    """The exposition family a sample name belongs to: ``x_bucket`` -> ``x`` when ``x`` is
    a histogram, else the name itself (counters are exposed with their ``_total``)."""
    for suffix in _HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in histograms:
            return name[: -len(suffix)]
    return name


def is_recorded(name: str) -> bool:
    """A recording rule's output (``level:metric:operation``), not vLLM's ``vllm:`` names."""
    return ":" in name and not name.startswith("vllm:")


def load_rules() -> dict[str, Any]:
    return dict(yaml.safe_load(RULES.read_text()))


def load_dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def rules_of(rules: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in rules["groups"] for rule in group["rules"]]


def recorded_names(rules: dict[str, Any]) -> set[str]:
    return {rule["record"] for rule in rules_of(rules) if "record" in rule}


def rule_exprs(rules: dict[str, Any]) -> list[Expr]:
    return [
        Expr(f"rules.yml {rule.get('record') or rule.get('alert')}", str(rule["expr"]))
        for rule in rules_of(rules)
    ]


def panels_of(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def dashboard_exprs(dashboard: dict[str, Any]) -> list[Expr]:
    return [
        Expr(f"dashboard {panel['title']!r} {target['refId']}", target["expr"])
        for panel in panels_of(dashboard)
        for target in panel.get("targets", [])
    ]


def variable_queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(variable, metric, label) of each ``label_values(metric, label)`` template query."""
    out = []
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = _LABEL_VALUES.match(variable["definition"])
        assert match, f"variable {variable['name']}: not label_values(metric, label)"
        out.append((variable["name"], match.group(1), match.group(2)))
    return out


def all_exprs() -> list[Expr]:
    """Every expression in rules.yml and the dashboard (template queries as selectors)."""
    dashboard = load_dashboard()
    variables = [
        Expr(f"dashboard variable {name}", metric)
        for name, metric, _ in variable_queries(dashboard)
    ]
    return rule_exprs(load_rules()) + dashboard_exprs(dashboard) + variables


def grafana_to_promql(expr: str, rate_interval: str = "1m") -> str:
    """A dashboard expression as Prometheus would get it with every variable on All."""
    text = expr.replace("$__rate_interval", rate_interval)
    return re.sub(r"\$\{?(model|tenant|target)\}?", ".*", text)
