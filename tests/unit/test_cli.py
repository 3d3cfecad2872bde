"""The command line: --version, check-config exit codes and messages."""

from __future__ import annotations

import pytest

from gateway import __version__
from gateway.cli import main


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"switchyard {__version__}"


def test_check_config_ok_and_reports_skipped_providers(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SOME_KEY_FOR_TEST", raising=False)
    path = tmp_path / "c.yaml"
    path.write_text(
        "providers:\n  oa: {type: openai, api_key_env: SOME_KEY_FOR_TEST}\n"
        "models:\n  m: {targets: [{provider: oa, model: x}]}\n"
    )
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "OK (1 providers, 1 models)" in out
    assert "oa (needs $SOME_KEY_FOR_TEST)" in out


def test_check_config_lists_every_error_and_exits_1(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(
        "providers:\n  a: {type: openai, timeout_s: -1}\n"
        "models:\n  m: {targets: [{provider: zz, model: x}]}\n"
    )
    assert main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: providers.a.timeout_s:" in err
    assert f"{path}: models.m.targets[0].provider: unknown provider 'zz'" in err


def test_config_path_from_environment(tmp_path, capsys, monkeypatch):
    path = tmp_path / "env.yaml"
    path.write_text("models: {}\n")
    monkeypatch.setenv("SWITCHYARD_CONFIG", str(path))
    assert main(["check-config"]) == 0
    assert str(path) in capsys.readouterr().out


def test_serve_refuses_an_invalid_config(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("nonsense: 1\n")
    assert main(["serve", "--config", str(path), "--port", "1"]) == 1
    assert "nonsense: unknown section" in capsys.readouterr().err


def test_unknown_arguments_are_rejected():
    with pytest.raises(SystemExit) as info:
        main(["check-config", "a.yaml", "--bogus"])
    assert info.value.code == 2


ROUTE_POLICY = """
providers:
  cheap: {type: openai, base_url: "http://127.0.0.1:9/v1"}
  premium: {type: openai, base_url: "http://127.0.0.1:9/v1"}
  onprem: {type: vllm, base_url: "http://127.0.0.1:9/v1"}
tenants:
  clinic: {local_only: true}
  frugal: {deny_providers: [premium]}
models:
  m:
    strategy: {type: lowest_cost}
    targets:
      - {provider: premium, model: big, price: {input_per_mtok: 3, output_per_mtok: 15}}
      - {provider: cheap, model: small, price: {input_per_mtok: 0.1, output_per_mtok: 0.4}}
      - {provider: onprem, model: local, max_context: 1000}
"""


def test_route_explain_prints_the_ordered_plan_with_reasons(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(ROUTE_POLICY)
    assert (
        main(["route", "explain", "--config", str(path), "--model", "m", "--prompt-tokens", "2000"])
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "model m (strategy LowestCostStrategy):"
    assert lines[1].startswith("  1. cheap/small: lowest_cost")
    assert lines[2].startswith("  2. premium/big: lowest_cost")
    assert lines[3].startswith("  -  onprem/local: skipped (context 1000 < ")


def test_route_explain_applies_the_tenants_residency(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(ROUTE_POLICY)
    assert (
        main(
            [
                "route",
                "explain",
                "--config",
                str(path),
                "--model",
                "m",
                "--tenant",
                "clinic",
                "--prompt-tokens",
                "10",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "  1. onprem/local:" in out
    assert "cheap/small: skipped (not local (data residency))" in out
    assert (
        main(["route", "explain", "--config", str(path), "--model", "m", "--tenant", "nobody"]) == 1
    )


def test_route_explain_applies_the_tenants_provider_lists(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(ROUTE_POLICY)
    assert (
        main(
            [
                "route",
                "explain",
                "--config",
                str(path),
                "--model",
                "m",
                "--tenant",
                "frugal",
                "--prompt-tokens",
                "10",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "premium/big: skipped (provider not allowed for this tenant)" in out
