"""The control plane's admin API over real HTTP, on both control-store backends (a SQLite
file; a fresh database of the machine's PostgreSQL): keys created, rotated, revoked,
expired and narrowed over the API are enforced at once on the replica that made the change,
the official openai SDK works with a key created over the API, the key's metadata lands in
its usage rows, every admin change leaves an audit record, and every failure path answers
in OpenAI's error shape with its status."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from core.clock import SystemClock
from policies.auth import KeysFile
from policies.control import Catalog, ControlPlane, ControlStore, CreateKey
from policies.control.sqlite import SqliteDatabase
from policies.ledger.sqlite import SqliteLedger
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.postgres_server import scratch_database, shared_postgres  # noqa: F401
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-control-0123456789"


@dataclass
class World:
    gateway: Gateway
    ledger: Path
    imported_key: str
    imported_id: str


def _config(folder: Path, upstream: str, control: str) -> str:
    return f"""
auth: {{admin_key_env: T_ADMIN, keys_file: {folder / "keys.json"}}}
control: {control}
tenants:
  acme: {{limits: {{rpm: 1000}}}}
  globex: {{}}
ledger: {{path: {folder / "usage.sqlite3"}}}
providers:
  oa: {{type: openai, base_url: "{upstream}/v1", api_key_env: T_OA}}
models:
  chat: {{targets: [{{provider: oa, model: m-count}}]}}
  json: {{targets: [{{provider: oa, model: m-json}}]}}
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("control")
    imported_key, imported = KeysFile(folder / "keys.json").create("globex", "legacy")
    upstream = FakeOpenAI()
    env = {"T_ADMIN": ADMIN, "T_OA": "sk-upstream"}
    with serve(upstream) as up:
        if request.param == "sqlite":
            control = f"{{path: {folder / 'control.sqlite3'}}}"
            with running_gateway(_config(folder, up.url, control), env) as gateway:
                yield World(gateway, folder / "usage.sqlite3", imported_key, imported.key_id)
            return
        admin_dsn = request.getfixturevalue("shared_postgres")
        with scratch_database(admin_dsn) as dsn:
            control = "{backend: postgres, dsn_env: T_CONTROL_DSN, poll_interval_s: 0.1}"
            config = _config(folder, up.url, control)
            with running_gateway(config, {**env, "T_CONTROL_DSN": dsn}) as gateway:
                yield World(gateway, folder / "usage.sqlite3", imported_key, imported.key_id)


def admin(world: World, method: str, path: str, body: Any = None, token: str | None = ADMIN,
          raw: bytes | None = None, **params: Any) -> httpx.Response:  # fmt: skip
    headers = {"authorization": f"Bearer {token}"} if token else {}
    content = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    return httpx.request(
        method, world.gateway.url + path, content=content, headers=headers, params=params or None
    )


def chat(world: World, key: str, model: str = "chat") -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(world.gateway.base_url + "/chat/completions", json=body, headers=headers)


def new_key(world: World, **fields: Any) -> tuple[str, dict[str, Any]]:
    answer = admin(world, "POST", "/admin/keys", {"tenant": "acme", **fields})
    assert answer.status_code == 201, answer.text
    view = answer.json()
    return view.pop("key"), view


def assert_error(answer: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code
    return error


async def ledger_rows(path: Path, tenant: str) -> list[Any]:
    ledger = SqliteLedger(path)
    try:
        return [row async for row in ledger.rows(tenant=tenant)]
    finally:
        await ledger.aclose()


@pytest.mark.anyio
async def test_the_openai_sdk_works_with_a_key_created_over_the_api(world: World) -> None:
    key, view = new_key(world, name="ci", metadata={"team": "search", "cost_center": "42"})
    assert key.startswith(f"sy-{view['id']}-") and view["status"] == "active"
    client = openai.AsyncOpenAI(base_url=world.gateway.base_url, api_key=key, max_retries=0)
    reply = await client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hello"}]
    )
    assert reply.choices[0].message.content == "Hello from openai!"
    mine = [row for row in await ledger_rows(world.ledger, "acme") if row.key_id == view["id"]]
    assert len(mine) == 1
    assert json.loads(mine[0].tags) == {"cost_center": "42", "team": "search"}


def test_the_secret_is_shown_once_and_the_hash_never(world: World) -> None:
    key, view = new_key(world)
    again = admin(world, "GET", f"/admin/keys/{view['id']}")
    assert again.status_code == 200 and again.headers["cache-control"] == "no-store"
    listed = admin(world, "GET", "/admin/keys", tenant="acme").json()["data"]
    assert view["id"] in {v["id"] for v in listed} and {v["tenant"] for v in listed} == {"acme"}
    secret = key.split("-", 2)[2]
    for text in (again.text, json.dumps(listed)):
        assert secret not in text and "sha256" not in text and "key" not in again.json()


def test_a_rotated_key_works_with_both_secrets_during_the_grace_period(world: World) -> None:
    old, view = new_key(world)
    answer = admin(world, "POST", f"/admin/keys/{view['id']}/rotate", {"grace_seconds": 600})
    assert answer.status_code == 200, answer.text
    new = answer.json()["key"]
    assert new != old and answer.json()["previous_valid_until"] is not None
    assert chat(world, old).status_code == 200 and chat(world, new).status_code == 200
    # a second rotation without grace: only the newest secret opens the key
    newest = admin(world, "POST", f"/admin/keys/{view['id']}/rotate", {"grace_seconds": 0})
    newest_key = newest.json()["key"]
    assert [chat(world, k).status_code for k in (old, new, newest_key)] == [401, 401, 200]


def test_the_old_secret_fails_once_the_grace_period_is_over(world: World) -> None:
    old, view = new_key(world)
    answer = admin(world, "POST", f"/admin/keys/{view['id']}/rotate", {"grace_seconds": 0.5})
    new = answer.json()["key"]
    deadline = time.monotonic() + 10
    while chat(world, old).status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert chat(world, old).status_code == 401
    assert chat(world, new).status_code == 200


def test_revoked_keys_fail_at_once_and_a_second_revoke_is_a_conflict(world: World) -> None:
    key, view = new_key(world)
    assert chat(world, key).status_code == 200
    revoked = admin(world, "POST", f"/admin/keys/{view['id']}/revoke")
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
    assert_error(chat(world, key), 401)
    assert_error(admin(world, "POST", f"/admin/keys/{view['id']}/revoke"), 409, "key_revoked")
    rotate = admin(world, "POST", f"/admin/keys/{view['id']}/rotate", {})
    assert_error(rotate, 409, "key_revoked")
    patch = admin(world, "PATCH", f"/admin/keys/{view['id']}", {"name": "x"})
    assert_error(patch, 409, "key_revoked")


def test_keys_expire_at_their_time(world: World) -> None:
    key, view = new_key(world, expires_at="2999-01-01T00:00:00Z")
    assert view["expires_at"] == 32472144000.0 and chat(world, key).status_code == 200
    past = admin(world, "PATCH", f"/admin/keys/{view['id']}", {"expires_at": time.time() - 1})
    assert past.status_code == 200 and past.json()["status"] == "expired"
    assert_error(chat(world, key), 401)
    cleared = admin(world, "PATCH", f"/admin/keys/{view['id']}", {"expires_at": None})
    assert cleared.json()["status"] == "active" and chat(world, key).status_code == 200
    created_expired = admin(world, "POST", "/admin/keys", {"tenant": "acme", "expires_at": 1.0})
    assert_error(created_expired, 400, "expires_in_past")


def test_allowed_models_narrow_what_the_key_may_use(world: World) -> None:
    key, view = new_key(world, allowed_models=["chat"])
    assert chat(world, key).status_code == 200
    error = assert_error(chat(world, key, model="json"), 403, "model_not_allowed")
    assert error["type"] == "permission_error" and "API key" in error["message"]
    models = httpx.get(
        world.gateway.base_url + "/models", headers={"authorization": f"Bearer {key}"}
    )
    assert [m["id"] for m in models.json()["data"]] == ["chat"]
    widened = admin(world, "PATCH", f"/admin/keys/{view['id']}", {"allowed_models": None})
    assert widened.json()["allowed_models"] is None
    assert chat(world, key, model="json").status_code == 200


def test_every_change_leaves_an_audit_record(world: World) -> None:
    _, view = new_key(world)
    admin(world, "PATCH", f"/admin/keys/{view['id']}", {"metadata": {"a": "b"}})
    admin(world, "POST", f"/admin/keys/{view['id']}/rotate", {"grace_seconds": 5})
    admin(world, "POST", f"/admin/keys/{view['id']}/revoke")
    answer = admin(world, "GET", "/admin/audit", target=view["id"])
    records = answer.json()["data"]
    assert [r["action"] for r in records] == [
        "key.revoke",
        "key.rotate",
        "key.update",
        "key.create",
    ]
    assert {r["actor"] for r in records} == {"admin"} and all(r["at"] > 0 for r in records)
    assert records[2]["details"] == {"metadata": {"a": "b"}}
    assert records[1]["details"]["grace_seconds"] == 5
    page = admin(world, "GET", "/admin/audit", target=view["id"], limit=2).json()
    rest = admin(world, "GET", "/admin/audit", target=view["id"], before=page["data"][-1]["id"])
    assert page["has_more"] and len(rest.json()["data"]) == 2
    assert "sk-" not in answer.text and "sha256" not in answer.text


def test_the_keys_file_was_imported_at_first_open(world: World) -> None:
    assert chat(world, world.imported_key).status_code == 200
    listed = admin(world, "GET", "/admin/keys", tenant="globex").json()["data"]
    assert world.imported_id in {v["id"] for v in listed}
    audit = admin(world, "GET", "/admin/audit", target=world.imported_id).json()["data"]
    assert [(r["action"], r["actor"]) for r in audit] == [("key.import", "keys_file")]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("POST", "/admin/keys", b"{not json", 400, "invalid_json"),
        ("POST", "/admin/keys", b"[]", 400, None),
        ("POST", "/admin/keys", b'{"tenant": "acme", "colour": 1}', 400, None),
        ("POST", "/admin/keys", b'{"name": "no tenant"}', 400, None),
        ("POST", "/admin/keys", b'{"tenant": "ghost"}', 404, "tenant_not_found"),
        ("POST", "/admin/keys", b'{"tenant": "acme", "allowed_models": ["nope"]}', 400,
         "model_not_found"),
        ("POST", "/admin/keys", b'{"tenant": "acme", "allowed_models": []}', 400, None),
        ("POST", "/admin/keys", b'{"tenant": "acme", "expires_at": "tomorrow"}', 400, None),
        ("POST", "/admin/keys", b'{"tenant": "acme", "metadata": {"": "x"}}', 400, None),
        ("POST", "/admin/keys", b'{"tenant": "acme", "metadata": {"a": 1}}', 400, None),
        ("GET", "/admin/keys/ffffffffffff", None, 404, "key_not_found"),
        ("PATCH", "/admin/keys/ffffffffffff", b'{"name": "x"}', 404, "key_not_found"),
        ("POST", "/admin/keys/ffffffffffff/rotate", None, 404, "key_not_found"),
        ("POST", "/admin/keys/ffffffffffff/revoke", None, 404, "key_not_found"),
        ("POST", "/admin/keys/ffffffffffff/rotate", b'{"grace_seconds": -1}', 400, None),
        ("GET", "/admin/audit?limit=0", None, 400, "invalid_value"),
        ("GET", "/admin/audit?before=x", None, 400, "invalid_value"),
    ],
)  # fmt: skip
def test_bad_requests_get_the_right_error(
    world: World, method: str, path: str, body: bytes | None, status: int, code: str | None
) -> None:
    error = assert_error(admin(world, method, path, raw=body), status, code)
    if status == 400 and code is None:
        assert error["type"] == "invalid_request_error"


def test_an_empty_patch_is_refused(world: World) -> None:
    _, view = new_key(world)
    assert_error(admin(world, "PATCH", f"/admin/keys/{view['id']}", {}), 400)


@pytest.mark.parametrize(
    "path", ["/admin/keys", "/admin/audit", "/admin/tenants", "/admin/control"]
)
def test_only_the_admin_may_call(world: World, path: str) -> None:
    key, _ = new_key(world)
    assert_error(admin(world, "GET", path, token=None), 401)
    assert_error(admin(world, "GET", path, token=key), 403, "admin_only")
    assert_error(admin(world, "POST", "/admin/keys", {"tenant": "acme"}, token=key), 403)


def test_tenants_created_and_changed_over_the_api_are_enforced(world: World) -> None:
    name = f"newco{int(time.monotonic() * 1000) % 100000}"
    created = admin(world, "POST", "/admin/tenants", {"name": name, "limits": {"rpm": 1}})
    assert created.status_code == 201, created.text
    assert created.json()["source"] == "api" and created.json()["config"]["limits"]["rpm"] == 1
    answer = admin(world, "POST", "/admin/keys", {"tenant": name})
    assert answer.status_code == 201, answer.text
    key = answer.json()["key"]
    assert chat(world, key).status_code == 200
    assert_error(chat(world, key), 429)  # the tenant's own rpm: 1
    raised = admin(world, "PATCH", f"/admin/tenants/{name}", {"limits": {"rpm": 100}})
    assert raised.json()["config"]["limits"]["rpm"] == 100
    assert chat(world, key).status_code == 200
    narrowed = admin(world, "PATCH", f"/admin/tenants/{name}", {"models": ["json"]})
    assert narrowed.json()["config"]["limits"]["rpm"] == 100  # a merge, not a replacement
    assert_error(chat(world, key), 403, "model_not_allowed")
    listed = {t["id"]: t for t in admin(world, "GET", "/admin/tenants").json()["data"]}
    assert listed[name]["source"] == "api" and listed["globex"]["source"] == "config"
    assert admin(world, "GET", f"/admin/tenants/{name}").json()["config"]["models"] == ["json"]
    audit = admin(world, "GET", "/admin/audit", target=name).json()["data"]
    assert [r["action"] for r in audit] == ["tenant.update", "tenant.update", "tenant.create"]


def test_a_policy_file_tenant_can_be_overridden(world: World) -> None:
    changed = admin(world, "PATCH", "/admin/tenants/globex", {"deny_models": ["json"]})
    assert changed.status_code == 200, changed.text
    assert changed.json()["overrides_config"] is True
    assert_error(chat(world, world.imported_key, model="json"), 403)
    admin(world, "PATCH", "/admin/tenants/globex", {"deny_models": None})
    assert chat(world, world.imported_key, model="json").status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("POST", "/admin/tenants", {"name": "acme"}, 409, "tenant_exists"),
        ("POST", "/admin/tenants", {"limits": {}}, 400, None),
        ("POST", "/admin/tenants", {"name": "bad name!"}, 400, None),
        ("POST", "/admin/tenants", {"name": "x1", "limits": {"rpm": 0}}, 400, None),
        ("POST", "/admin/tenants", {"name": "x2", "models": ["nope"]}, 400, None),
        ("POST", "/admin/tenants", {"name": "x3", "providers": ["nope"]}, 400, None),
        ("POST", "/admin/tenants", {"name": "x4", "colour": "red"}, 400, None),
        ("PATCH", "/admin/tenants/ghost", {"weight": 2}, 404, "tenant_not_found"),
        ("PATCH", "/admin/tenants/acme", {}, 400, None),
        ("PATCH", "/admin/tenants/acme", {"weight": -1}, 400, None),
        ("GET", "/admin/tenants/ghost", None, 404, "tenant_not_found"),
    ],
)
def test_bad_tenant_requests_get_the_right_error(
    world: World, method: str, path: str, body: Any, status: int, code: str | None
) -> None:
    assert_error(admin(world, method, path, body), status, code)
    assert_error(admin(world, "POST", "/admin/tenants", raw=b"{oops"), 400, "invalid_json")


def test_the_control_status_reports_this_replicas_view(world: World) -> None:
    status = admin(world, "GET", "/admin/control").json()
    assert status["backend"] in ("sqlite", "postgres") and status["version"] >= 1
    assert status["keys"] >= 1 and status["failures"] == 0 and status["last_error"] is None


def test_a_gateway_without_a_control_plane_says_so(tmp_path: Path) -> None:
    config = f"auth: {{admin_key_env: T_ADMIN}}\nledger: {{path: {tmp_path / 'u.sqlite3'}}}\n"
    with running_gateway(config, {"T_ADMIN": ADMIN}) as gateway:
        world = World(gateway, tmp_path, "", "")
        assert_error(admin(world, "GET", "/admin/keys"), 400, "control_plane_disabled")
        assert_error(admin(world, "POST", "/admin/tenants", {"name": "a"}), 400)


def test_a_restarted_gateway_serves_the_stored_tenants_and_keys(tmp_path: Path) -> None:
    path = tmp_path / "control.sqlite3"

    async def seed() -> str:
        store = ControlStore(SqliteDatabase(path), SystemClock())
        await store.open()
        plane = ControlPlane(store, SystemClock())
        catalog = Catalog(tenants={}, models=frozenset({"chat"}), providers=frozenset({"oa"}))
        tenant = await plane.create_tenant("newco", {"models": ["chat"]}, catalog, "admin")
        catalog = Catalog(tenants={"newco": tenant.config}, models=catalog.models,
                          providers=catalog.providers)  # fmt: skip
        key, _ = await plane.create_key(CreateKey(tenant="newco"), catalog, "admin")
        await store.aclose()
        return key

    key = asyncio.run(seed())
    with serve(FakeOpenAI()) as up:
        # no `tenants:` in the file: the stored tenant alone closes the gateway
        config = f"""
auth: {{admin_key_env: T_ADMIN}}
control: {{path: {path}}}
ledger: {{path: {tmp_path / "usage.sqlite3"}}}
providers: {{oa: {{type: openai, base_url: "{up.url}/v1", api_key_env: T_OA}}}}
models: {{chat: {{targets: [{{provider: oa, model: m-ok}}]}}}}
"""
        env = {"T_ADMIN": ADMIN, "T_OA": "sk-upstream"}
        with running_gateway(config, env) as gateway:
            world = World(gateway, tmp_path, "", "")
            assert chat(world, key).status_code == 200
            assert_error(chat(world, "sy-000000000000-unknown"), 401)
            tenants = admin(world, "GET", "/admin/tenants").json()["data"]
            assert [(t["id"], t["source"]) for t in tenants] == [("newco", "api")]
