"""``switchyard keys create|revoke|list``, driven through a parser built with add_parser."""

from __future__ import annotations

import argparse
import os
import stat

import pytest

from core.clock import FakeClock
from gateway.cli.keys import add_parser, run
from policies.auth import KeyIndex, KeysFile

CONFIG = "tenants:\n  acme: {}\n  beta: {}\nauth:\n  keys_file: state/keys.json\n"


def keys_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="switchyard")
    commands = parser.add_subparsers(dest="command", required=True)
    add_parser(commands)
    args = parser.parse_args(list(argv))
    assert args.command == "keys"
    return run(args)


@pytest.fixture
def config_path(tmp_path, monkeypatch):
    monkeypatch.delenv("SWITCHYARD_CONFIG", raising=False)
    path = tmp_path / "policy.yaml"
    path.write_text(CONFIG)
    return path


def test_create_prints_the_key_once_on_stdout(config_path, capsys):
    assert (
        keys_cli("keys", "create", "--tenant", "acme", "--name", "ci", "--config", str(config_path))
        == 0
    )
    out, err = capsys.readouterr()
    key = out.strip()
    assert out.count("\n") == 1 and key.startswith("sy-")
    keys_file = config_path.parent / "state" / "keys.json"  # relative to the policy file
    assert stat.S_IMODE(os.stat(keys_file).st_mode) == 0o600
    record = KeyIndex(keys_file, FakeClock()).verify(key)
    assert record is not None and (record.tenant, record.name) == ("acme", "ci")
    assert record.key_id in err and key not in err
    assert key not in keys_file.read_text()


def test_create_refuses_an_unknown_tenant(config_path, capsys):
    assert keys_cli("keys", "create", "--tenant", "ghost", "--config", str(config_path)) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "unknown tenant 'ghost'" in err and "acme, beta" in err
    assert not (config_path.parent / "state" / "keys.json").exists()


def test_a_config_without_keys_file_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("tenants:\n  acme: {}\n")
    assert keys_cli("keys", "create", "--tenant", "acme", "--config", str(path)) == 1
    assert "auth.keys_file is not set" in capsys.readouterr().err


def test_a_missing_or_invalid_config_is_reported(tmp_path, capsys):
    assert keys_cli("keys", "list", "--config", str(tmp_path / "none.yaml")) == 1
    assert "cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("auth: {keys_file: 3}\n")
    assert keys_cli("keys", "list", "--config", str(bad)) == 1
    assert f"{bad}: auth.keys_file" in capsys.readouterr().err


def test_revoke_marks_the_key_and_unknown_ids_fail(config_path, capsys):
    keys = KeysFile(config_path.parent / "state" / "keys.json")
    plaintext, record = keys.create("beta", "web")
    assert keys_cli("keys", "revoke", record.key_id, "--config", str(config_path)) == 0
    assert f"revoked key {record.key_id}" in capsys.readouterr().out
    assert KeyIndex(keys.path, FakeClock()).verify(plaintext) is None
    assert keys.list_keys()[0].revoked_at is not None
    assert keys_cli("keys", "revoke", "ffffffffffff", "--config", str(config_path)) == 1
    assert "no key with id 'ffffffffffff'" in capsys.readouterr().err


def test_list_shows_ids_and_labels_never_secrets_or_hashes(config_path, capsys):
    keys = KeysFile(config_path.parent / "state" / "keys.json")
    a_key, a = keys.create("acme", "ci", now=1_700_000_000.0)
    _, b = keys.create("beta", "web", now=1_700_000_100.0)
    keys.revoke(b.key_id, now=1_700_003_600.0)
    assert keys_cli("keys", "list", "--config", str(config_path)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["KEY_ID", "TENANT", "NAME", "CREATED", "REVOKED"]
    assert lines[1].split() == [a.key_id, "acme", "ci", "2023-11-14T22:13:20Z", "-"]
    assert lines[2].split() == [
        b.key_id,
        "beta",
        "web",
        "2023-11-14T22:15:00Z",
        "2023-11-14T23:13:20Z",
    ]
    text = "\n".join(lines)
    assert a.sha256 not in text and a_key.split("-", 2)[2] not in text
    assert keys_cli("keys", "list", "--tenant", "beta", "--config", str(config_path)) == 0
    only = capsys.readouterr().out.splitlines()
    assert len(only) == 2 and only[1].startswith(b.key_id)


def test_config_path_defaults_to_the_environment(config_path, monkeypatch, capsys):
    monkeypatch.setenv("SWITCHYARD_CONFIG", str(config_path))
    assert keys_cli("keys", "create", "--tenant", "beta") == 0
    key = capsys.readouterr().out.strip()
    records = KeysFile(config_path.parent / "state" / "keys.json").list_keys()
    assert [(r.tenant, r.name) for r in records] == [("beta", "default")]
    assert KeyIndex(config_path.parent / "state" / "keys.json", FakeClock()).verify(key)


def test_keys_needs_a_subcommand():
    with pytest.raises(SystemExit) as info:
        keys_cli("keys")
    assert info.value.code == 2
