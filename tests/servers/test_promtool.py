"""``promtool`` on the shipped files: the rules and the example config are valid, and the
rule unit tests (deploy/prometheus/rules_test.yml) pass, and fail when an alert they pin
is changed (so they do test the alerts)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.servers.deploy_files import EXAMPLE_CONFIG, RULES, RULES_TEST, load_rules, rules_of
from tests.servers.prometheus import needs_prometheus

pytestmark = [pytest.mark.servers, needs_prometheus]


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_rules_pass_promtool_check_rules() -> None:
    done = promtool("check", "rules", RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules_of(load_rules()))} rules found" in done.stdout


def test_the_example_config_passes_promtool_check_config() -> None:
    done = promtool("check", "config", EXAMPLE_CONFIG)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 1 rule files found" in done.stdout  # it loads rules.yml


def test_the_rule_unit_tests_pass() -> None:
    done = promtool("test", "rules", RULES_TEST)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.parametrize(
    ("alert", "original", "changed"),
    [
        ("SwitchyardBreakerOpen", 'state="open"}) == 1', 'state="half_open"}) == 1'),
        (
            "SwitchyardHighErrorRatio",
            "switchyard:error_ratio:rate5m > 0.05",
            "switchyard:error_ratio:rate5m > 0.5",
        ),
    ],
)
def test_the_rule_unit_tests_fail_when_an_alert_changes(
    tmp_path: Path, alert: str, original: str, changed: str
) -> None:
    """rules_test.yml run against a copy of rules.yml whose ``alert`` expression was altered."""
    text = RULES.read_text()
    assert text.count(original) == 1
    (tmp_path / "rules.yml").write_text(text.replace(original, changed))
    shutil.copy(RULES_TEST, tmp_path / "rules_test.yml")
    done = promtool("test", "rules", tmp_path / "rules_test.yml")
    assert done.returncode != 0
    assert f"alertname: {alert}" in done.stdout + done.stderr
