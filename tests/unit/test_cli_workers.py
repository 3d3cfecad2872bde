"""``switchyard workers status``: the table it prints and its exit status without a key."""

from __future__ import annotations

import pytest

from gateway.cli.main import main
from gateway.cli.workers import table


def row(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "name": "gpu",
        "replica": 0,
        "provider": "pool",
        "state": "ready",
        "pid": 4242,
        "port": 8100,
        "devices": ["0", "1"],
        "restarts": 2,
        "last_exit_code": -9,
        "waiting": 3,
        "running": 12,
        "kv_usage": 0.415,
        "outgoing": False,
    }
    return {**base, **fields}


def test_the_table_has_one_aligned_line_per_worker() -> None:
    lines = table([row(), row(replica=1, state="backoff", pid=None, waiting=None, outgoing=True)])
    assert lines[0].split() == [
        "WORKER",
        "STATE",
        "PID",
        "PORT",
        "DEVICES",
        "RESTARTS",
        "LAST_EXIT",
        "WAITING",
        "RUNNING",
        "KV_USE",
        "PROVIDER",
    ]
    assert lines[1].split() == [
        "gpu/0",
        "ready",
        "4242",
        "8100",
        "0,1",
        "2",
        "-9",
        "3",
        "12",
        "42%",
        "pool",
    ]
    assert lines[2].split()[:4] == ["gpu/1", "backoff", "(outgoing)", "-"]
    assert lines[1].index("4242") == lines[0].index("PID")  # aligned columns


def test_without_an_admin_key_it_says_how_to_give_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SWITCHYARD_ADMIN_KEY", raising=False)
    assert main(["workers", "status", "--url", "http://127.0.0.1:9"]) == 1
    assert "--admin-key or set $SWITCHYARD_ADMIN_KEY" in capsys.readouterr().err


def test_an_unreachable_gateway_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["workers", "status", "--url", "http://127.0.0.1:9", "--admin-key", "k"])
    assert code == 1
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err
