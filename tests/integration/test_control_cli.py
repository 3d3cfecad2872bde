"""``switchyard keys`` against the control plane: directly on the store the policy file
names (``control:``), and against a running gateway's admin API (``--url``). Keys it
creates work over HTTP, rotations print the new secret once, revocations take effect, and
failures are one line on stderr with exit code 1. The legacy keys-file mode has its own
tests (tests/unit/test_cli_keys.py)."""

from __future__ import annotations

import argparse
import getpass
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.cli.keys import add_parser, run
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-cli-0123456789"


_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")


def printed(capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """(stdout, stderr) of the command, without the in-process gateway's log lines."""
    out, err = capsys.readouterr()
    keep = [line for line in out.splitlines(keepends=True) if not _LOG_LINE.match(line)]
    return "".join(keep), err


def keys_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="switchyard")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(["keys", *argv]))


def policy(folder: Path, upstream: str = "http://127.0.0.1:9/v1") -> str:
    return f"""
auth: {{admin_key_env: T_ADMIN}}
control: {{path: {folder / "control.sqlite3"}}}
tenants: {{acme: {{}}, beta: {{}}}}
ledger: {{path: {folder / "usage.sqlite3"}}}
providers: {{oa: {{type: openai, base_url: "{upstream}", api_key_env: T_OA}}}}
models: {{chat: {{targets: [{{provider: oa, model: m-ok}}]}}}}
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Path]]:
    folder = tmp_path_factory.mktemp("cli")
    with serve(FakeOpenAI()) as up:
        text = policy(folder, f"{up.url}/v1")
        (folder / "policy.yaml").write_text(text)
        with running_gateway(text, {"T_ADMIN": ADMIN, "T_OA": "sk-x"}) as gw:
            yield gw, folder / "policy.yaml"


def chat(gateway: Gateway, key: str) -> int:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {key}"}
    answer = httpx.post(gateway.base_url + "/chat/completions", json=body, headers=headers)
    return answer.status_code


def status_within(gateway: Gateway, key: str, wanted: int) -> int:
    """The gateway polls the store every 250 ms: wait (bounded) for a CLI change."""
    deadline = time.monotonic() + 10
    status = chat(gateway, key)
    while status != wanted and time.monotonic() < deadline:
        time.sleep(0.05)
        status = chat(gateway, key)
    return status


def test_the_store_mode_creates_lists_rotates_and_revokes(gateway, capsys) -> None:
    gw, path = gateway
    config = ("--config", str(path))
    created = keys_cli("create", "--tenant", "acme", "--name", "ci", "--models", "chat",
                       "--meta", "team=search", "--expires-at", "2999-01-01T00:00:00Z", *config)  # fmt: skip
    assert created == 0
    out, err = printed(capsys)
    key = out.strip()
    key_id = key.split("-")[1]
    assert key.startswith("sy-") and key_id in err and key not in err
    assert status_within(gw, key, 200) == 200  # a running gateway picks it up
    assert keys_cli("list", "--tenant", "acme", *config) == 0
    lines = printed(capsys)[0].splitlines()
    assert lines[0].split() == ["KEY_ID", "TENANT", "NAME", "CREATED", "REVOKED", "EXPIRES"]
    assert any(line.startswith(key_id) and line.endswith("2999-01-01T00:00:00Z") for line in lines)
    assert keys_cli("rotate", key_id, "--grace-seconds", "0", *config) == 0
    out, err = printed(capsys)
    new_key = out.strip()
    assert new_key != key and "rotated key" in err
    assert status_within(gw, key, 401) == 401 and chat(gw, new_key) == 200
    assert keys_cli("revoke", key_id, *config) == 0
    assert f"revoked key {key_id} (tenant acme)" in printed(capsys)[0]
    assert status_within(gw, new_key, 401) == 401
    audit = httpx.get(gw.url + "/admin/audit", params={"target": key_id},
                      headers={"authorization": f"Bearer {ADMIN}"}).json()["data"]  # fmt: skip
    assert {a["actor"] for a in audit} == {f"cli:{getpass.getuser()}"}
    assert [a["action"] for a in audit] == ["key.revoke", "key.rotate", "key.create"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("create", "--tenant", "ghost"), "No tenant named 'ghost'"),
        (("create", "--tenant", "acme", "--models", "nope"), "Unknown model alias 'nope'"),
        (("create", "--tenant", "acme", "--meta", "novalue"), "--meta takes KEY=VALUE"),
        (("create", "--tenant", "acme", "--expires-at", "soon"), "expires_at"),
        (("revoke", "ffffffffffff"), "No API key with id 'ffffffffffff'"),
        (("rotate", "ffffffffffff"), "No API key with id 'ffffffffffff'"),
    ],
)
def test_store_mode_failures_are_one_line(gateway, capsys, argv, message) -> None:
    _, path = gateway
    assert keys_cli(*argv, "--config", str(path)) == 1
    out, err = printed(capsys)
    assert out == "" and message in err and err.startswith("switchyard keys: ")


def test_the_api_mode_works_against_a_running_gateway(gateway, capsys, monkeypatch) -> None:
    gw, _ = gateway
    monkeypatch.setenv("SWITCHYARD_ADMIN_KEY", ADMIN)
    assert keys_cli("create", "--tenant", "beta", "--url", gw.url) == 0
    key = printed(capsys)[0].strip()
    key_id = key.split("-")[1]
    assert chat(gw, key) == 200  # the replica that made the change enforces it at once
    assert keys_cli("list", "--url", gw.url, "--tenant", "beta") == 0
    assert key_id in printed(capsys)[0]
    assert keys_cli("rotate", key_id, "--url", gw.url, "--grace-seconds", "60") == 0
    new_key = printed(capsys)[0].strip()
    assert chat(gw, key) == 200 and chat(gw, new_key) == 200  # both in the grace period
    assert keys_cli("revoke", key_id, "--url", gw.url) == 0
    printed(capsys)
    assert chat(gw, key) == 401 and chat(gw, new_key) == 401
    assert keys_cli("revoke", key_id, "--url", gw.url) == 1
    assert "409" in printed(capsys)[1]


def test_the_api_mode_needs_the_admin_key(gateway, capsys, monkeypatch) -> None:
    gw, _ = gateway
    monkeypatch.delenv("SWITCHYARD_ADMIN_KEY", raising=False)
    assert keys_cli("list", "--url", gw.url) == 1
    assert "needs the admin key in $SWITCHYARD_ADMIN_KEY" in printed(capsys)[1]
    monkeypatch.setenv("WRONG", "sy-not-the-admin")
    assert keys_cli("list", "--url", gw.url, "--admin-key-env", "WRONG") == 1
    assert "401" in printed(capsys)[1]
    assert keys_cli("list", "--url", "http://127.0.0.1:9", "--admin-key-env", "WRONG") == 1
    assert "cannot reach" in printed(capsys)[1]


def test_the_keys_file_cannot_rotate(tmp_path, capsys) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"tenants: {{acme: {{}}}}\nauth: {{keys_file: {tmp_path / 'k.json'}}}\n")
    assert keys_cli("rotate", "ffffffffffff", "--config", str(path)) == 1
    assert "rotate needs a `control:` section" in printed(capsys)[1]
    assert keys_cli("create", "--tenant", "acme", "--models", "x", "--config", str(path)) == 1
    assert "need a `control:` section" in printed(capsys)[1]
