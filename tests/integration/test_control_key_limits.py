"""A key's own limits and budgets over real HTTP, with the official openai SDK as client:
two gateway replicas share one control store and one quota state (a SQLite file with the
memory store; a PostgreSQL database with a real Redis). A key created with its own limits
is held to them (429 with x-ratelimit-* headers, or ``insufficient_quota`` once its daily
budget is spent) while its tenant's other keys are not; a PATCH takes effect on the other
replica within its poll; limits are shown, audited and refused when not positive; and
``switchyard keys create --rpm ...`` sets them."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.cli.keys import add_parser, run
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.postgres_server import scratch_database, shared_postgres  # noqa: F401
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-keylimits-0123456789"
# m-count answers 5 completion tokens; only output is priced: 0.005 USD per request, and
# with max_tokens 5 the estimate is exact.
MAX_TOKENS = 5
PER_REQUEST_USD = 0.005


@dataclass
class World:
    a: Gateway  # the replica the admin calls
    b: Gateway  # another replica on the same stores


def _config(folder: Path, replica: str, upstream: str, control: str, state: str) -> str:
    return f"""
auth: {{admin_key_env: T_ADMIN}}
control: {control}
state: {state}
tenants:
  acme: {{key_limits: {{rpm: 100}}}}
  globex: {{}}
ledger: {{path: {folder / f"usage-{replica}.sqlite3"}}}
providers:
  oa: {{type: openai, base_url: "{upstream}/v1", api_key_env: T_OA}}
models:
  chat: {{targets: [{{provider: oa, model: m-count, price: {{output_per_mtok: 1000}}}}]}}
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("keylimits")
    env = {"T_ADMIN": ADMIN, "T_OA": "sk-upstream"}
    with serve(FakeOpenAI()) as up:
        if request.param == "sqlite":
            control = f"{{path: {folder / 'control.sqlite3'}}}"
            texts = [_config(folder, r, up.url, control, "{backend: memory}") for r in "ab"]
            with running_gateway(texts[0], env) as a, running_gateway(texts[1], env) as b:
                yield World(a, b)
            return
        redis = request.getfixturevalue("redis_server")
        redis.start()
        redis.flushall()
        state = f'{{backend: redis, redis: {{url: "{redis.url}", timeout_s: 5}}}}'
        admin_dsn = request.getfixturevalue("shared_postgres")
        with scratch_database(admin_dsn) as dsn:
            env = {**env, "T_CONTROL_DSN": dsn}
            control = "{backend: postgres, dsn_env: T_CONTROL_DSN}"
            texts = [_config(folder, r, up.url, control, state) for r in "ab"]
            with running_gateway(texts[0], env) as a, running_gateway(texts[1], env) as b:
                yield World(a, b)


def admin(gateway: Gateway, method: str, path: str, body: Any = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {ADMIN}"}
    return httpx.request(method, gateway.url + path, json=body, headers=headers)


def new_key(world: World, tenant: str = "acme", **fields: Any) -> tuple[str, dict[str, Any]]:
    answer = admin(world.a, "POST", "/admin/keys", {"tenant": tenant, **fields})
    assert answer.status_code == 201, answer.text
    view = answer.json()
    return view.pop("key"), view


def sdk(gateway: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)


def ask(gateway: Gateway, key: str) -> httpx.Response:
    """One chat completion through the openai SDK: its raw HTTP response, errors included."""
    client = sdk(gateway, key)
    messages: Any = [{"role": "user", "content": "hi"}]
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="chat", messages=messages, max_tokens=MAX_TOKENS
        )
    except openai.APIStatusError as exc:
        return exc.response
    return raw.http_response


def statuses(gateway: Gateway, key: str, n: int) -> list[int]:
    return [ask(gateway, key).status_code for _ in range(n)]


def same_window(seconds: float, needed_s: float = 5.0) -> None:
    """Counters are per UTC minute (or day): start a sequence that must stay in one window
    only when it has ``needed_s`` left."""
    left = seconds - time.time() % seconds
    if left < needed_s:
        time.sleep(left + 0.1)


def until(gateway: Gateway, key: str, wanted: int, deadline_s: float = 10.0) -> int:
    """Ask until the answer is ``wanted`` (another replica follows the store within its
    poll) or the deadline passes; the last status."""
    deadline = time.monotonic() + deadline_s
    status = ask(gateway, key).status_code
    while status != wanted and time.monotonic() < deadline:
        time.sleep(0.05)
        status = ask(gateway, key).status_code
    return status


def test_a_key_with_its_own_rpm_gets_429_and_its_tenants_other_keys_do_not(world) -> None:
    same_window(60)
    key, view = new_key(world, limits={"rpm": 2})
    other, _ = new_key(world)  # the tenant's key_limits: rpm 100
    assert view["limits"] == {
        "rpm": 2, "tpm": None, "concurrency": None, "usd_per_day": None, "usd_per_month": None
    }  # fmt: skip
    first = ask(world.a, key)
    assert first.status_code == 200 and first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert ask(world.a, key).status_code == 200
    refused = ask(world.a, key)
    assert refused.status_code == 429
    assert refused.headers["x-ratelimit-limit-requests"] == "2"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert int(refused.headers["retry-after"]) >= 1
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert f"key '{view['id']}'" in error["message"]
    with pytest.raises(openai.RateLimitError):
        sdk(world.a, key).chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}]
        )
    assert statuses(world.a, other, 3) == [200, 200, 200]
    assert ask(world.a, other).headers["x-ratelimit-limit-requests"] == "100"


def test_a_patch_raising_the_limit_lets_the_key_through_on_every_replica(world) -> None:
    same_window(60, needed_s=10)
    key, view = new_key(world, limits={"rpm": 1})
    assert until(world.b, key, 200) == 200  # replica b has loaded the new key
    assert ask(world.b, key).status_code == 429  # its second request this minute
    changed = admin(world.a, "PATCH", f"/admin/keys/{view['id']}", {"limits": {"rpm": 50}})
    assert changed.status_code == 200 and changed.json()["limits"]["rpm"] == 50
    started = time.monotonic()
    assert until(world.b, key, 200) == 200  # b follows the store within its poll
    print(f"replica b enforced the raised limit after {time.monotonic() - started:.2f} s")
    assert ask(world.a, key).headers["x-ratelimit-limit-requests"] == "50"  # a: at once
    got = admin(world.a, "GET", f"/admin/keys/{view['id']}").json()
    assert got["limits"]["rpm"] == 50
    back = admin(world.a, "PATCH", f"/admin/keys/{view['id']}", {"limits": None})
    assert back.json()["limits"] is None  # the tenant's key_limits again
    assert ask(world.a, key).headers["x-ratelimit-limit-requests"] == "100"
    audit = admin(world.a, "GET", f"/admin/audit?target={view['id']}").json()["data"]
    assert [(r["action"], (r["details"].get("limits") or {}).get("rpm")) for r in audit] == [
        ("key.update", None),
        ("key.update", 50),
        ("key.create", 1),
    ]


def test_a_daily_budget_refuses_once_spent(world) -> None:
    same_window(86_400, needed_s=60)
    budget = 2.5 * PER_REQUEST_USD  # two requests fit, a third would pass it
    key, _ = new_key(world, limits={"usd_per_day": budget})
    other, _ = new_key(world)
    assert statuses(world.a, key, 2) == [200, 200]
    refused = ask(world.a, key)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "insufficient_quota"
    assert "USD per day" in refused.json()["error"]["message"]
    assert statuses(world.a, other, 3) == [200, 200, 200]


def test_a_tenant_without_limits_is_limited_through_its_keys_own(world) -> None:
    same_window(60)
    key, _ = new_key(world, tenant="globex", limits={"rpm": 1})
    free, _ = new_key(world, tenant="globex")
    assert statuses(world.a, key, 2) == [200, 429]
    assert statuses(world.a, free, 3) == [200, 200, 200]


@pytest.mark.parametrize(
    ("limits", "param"),
    [
        ({"rpm": 0}, "limits.rpm"),
        ({"tpm": -1}, "limits.tpm"),
        ({"concurrency": 1.5}, "limits.concurrency"),
        ({"usd_per_day": 0}, "limits.usd_per_day"),
        ({"usd_per_month": "ten"}, "limits.usd_per_month"),
        ({"rps": 3}, "limits"),
        ([2], "limits"),
    ],
)
def test_bad_limits_get_400_with_param(world, limits: Any, param: str) -> None:
    _, view = new_key(world)
    for method, path, body in (
        ("POST", "/admin/keys", {"tenant": "acme", "limits": limits}),
        ("PATCH", f"/admin/keys/{view['id']}", {"limits": limits}),
    ):
        answer = admin(world.a, method, path, body)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error" and error["param"] == param
    assert admin(world.a, "GET", f"/admin/keys/{view['id']}").json()["limits"] is None


def keys_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="switchyard")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(["keys", *argv]))


def test_the_cli_creates_keys_with_limits(world, capsys, monkeypatch) -> None:
    monkeypatch.setenv("SWITCHYARD_ADMIN_KEY", ADMIN)
    flags = ("--rpm", "3", "--tpm", "9000", "--concurrency", "2", "--usd-per-day", "1.5",
             "--usd-per-month", "20")  # fmt: skip
    assert keys_cli("create", "--tenant", "acme", *flags, "--url", world.a.url) == 0
    key = capsys.readouterr().out.strip().splitlines()[-1]
    view = admin(world.a, "GET", f"/admin/keys/{key.split('-')[1]}").json()
    assert view["limits"] == {
        "rpm": 3, "tpm": 9000, "concurrency": 2, "usd_per_day": 1.5, "usd_per_month": 20.0
    }  # fmt: skip
    assert ask(world.a, key).headers["x-ratelimit-limit-requests"] == "3"
    assert keys_cli("create", "--tenant", "acme", "--rpm", "0", "--url", world.a.url) == 1
    assert "limits.rpm" in capsys.readouterr().err


def test_the_keys_file_cannot_hold_limits(tmp_path, capsys) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"tenants: {{acme: {{}}}}\nauth: {{keys_file: {tmp_path / 'k.json'}}}\n")
    assert keys_cli("create", "--tenant", "acme", "--rpm", "2", "--config", str(path)) == 1
    assert "need a `control:` section" in capsys.readouterr().err
    assert not (tmp_path / "k.json").exists()


def test_the_quota_view_of_a_key_shows_its_own_limits(world) -> None:
    _, view = new_key(world, limits={"rpm": 7})
    answer = admin(world.a, "GET", f"/admin/tenants/acme/quota?key_id={view['id']}")
    assert answer.status_code == 200, answer.text
    keyed = {(e["scope"], e["metric"]): e["limit"] for e in answer.json()["limits"]}
    assert keyed[("key", "requests")] == 7  # not the tenant's key_limits (100)
