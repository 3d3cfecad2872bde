"""The console's failure paths over real HTTP (a gateway on 127.0.0.1, httpx as the
browser), with sessions on both shared-store backends (memory and a real Redis): bad and
non-console credentials, CSRF refusals, a tenant admin's URL edits, sessions that end with
their key, an unreachable session store, bad form and query values, a gateway without a
control plane. The happy paths in a real browser are in tests/browser/."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.fixtures.redis_server import RedisServer
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-console-0123456789"
CONFIG = """
auth: {{admin_key_env: T_ADMIN}}
{control}
state: {state}
tenants:
  acme: {{limits: {{rpm: 1000}}}}
  globex: {{}}
ledger: {{path: {folder}/usage.sqlite3}}
providers:
  oa: {{type: openai, base_url: "http://127.0.0.1:9/v1", api_key_env: T_OA}}
models:
  chat: {{targets: [{{provider: oa, model: m}}]}}
"""


@dataclass
class World:
    gateway: Gateway
    backend: str

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.gateway.url, follow_redirects=False, timeout=10)

    @property
    def origin(self) -> dict[str, str]:
        return {"origin": self.gateway.url, "sec-fetch-site": "same-origin"}


def _gateway(folder: Path, state: str, control: bool) -> Iterator[Gateway]:
    text = CONFIG.format(
        folder=folder,
        state=state,
        control=f"control: {{path: {folder}/control.sqlite3}}" if control else "",
    )
    with running_gateway(text, {"T_ADMIN": ADMIN, "T_OA": "sk-x"}) as gateway:
        yield gateway


def _state(request: pytest.FixtureRequest, backend: str) -> str:
    if backend == "memory":
        return "{backend: memory}"
    server: RedisServer = request.getfixturevalue("redis_server")
    server.start()
    server.flushall()
    return f"{{backend: redis, redis: {{url: '{server.url}', timeout_s: 0.5}}}}"


@pytest.fixture(scope="module", params=["memory", "redis"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:  # fmt: skip
    folder = tmp_path_factory.mktemp("console")
    for gateway in _gateway(folder, _state(request, request.param), control=True):
        yield World(gateway, request.param)


def login(world: World, client: httpx.Client, credential: str) -> httpx.Response:
    page = client.get("/console/login")
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert token is not None
    form = {"credential": credential, "csrf_token": token.group(1)}
    return client.post("/console/login", data=form, headers=world.origin)


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert found is not None, page.text[:500]
    return found.group(1)


def admin_api(world: World, method: str, path: str, body: object = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {ADMIN}"}
    return httpx.request(method, world.gateway.url + path, json=body, headers=headers)


def new_key(world: World, tenant: str, console: bool) -> tuple[str, str]:
    metadata = {"console_role": "tenant_admin"} if console else {}
    answer = admin_api(world, "POST", "/admin/keys", {"tenant": tenant, "metadata": metadata})
    assert answer.status_code == 201, answer.text
    return answer.json()["key"], answer.json()["id"]


def assert_page(answer: httpx.Response, status: int, text: str) -> None:
    assert answer.status_code == status, answer.text[:500]
    assert answer.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in answer.headers["content-security-policy"]
    assert text in answer.text, answer.text[:800]


def test_the_admin_key_opens_a_strict_http_only_session(world: World) -> None:
    with world.client() as client:
        answer = login(world, client, ADMIN)
        assert answer.status_code == 303 and answer.headers["location"] == "/console/overview"
        cookie = next(c for c in answer.headers.get_list("set-cookie") if "sy_console=" in c)
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
        assert_page(client.get("/console/overview"), 200, "Overview")


@pytest.mark.parametrize(
    ("credential", "status", "text"),
    [
        ("sy-000000000000-wrong", 401, "Incorrect API key provided."),
        ("", 401, "Enter the admin key or a tenant admin key."),
        ("plain-tenant-key", 403, "may call the API but not open the console"),
    ],
)
def test_other_credentials_are_refused_at_login(
    world: World, credential: str, status: int, text: str
) -> None:
    if credential == "plain-tenant-key":
        credential, _ = new_key(world, "acme", console=False)
    with world.client() as client:
        answer = login(world, client, credential)
        assert_page(answer, status, text)
        assert "sy_console=" not in answer.headers.get("set-cookie", "")
        assert client.get("/console/overview").headers["location"] == "/console/login"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ("no-cookie", "CSRF token is missing or wrong"),
        ("wrong-token", "CSRF token is missing or wrong"),
        ("other-origin", "another site"),
        ("no-origin", "names no origin"),
    ],
)
def test_a_forged_login_is_refused(world: World, change: str, why: str) -> None:
    with world.client() as client:
        token = csrf_of(client.get("/console/login"))
        headers = dict(world.origin)
        if change == "no-cookie":
            client.cookies.clear()
        if change == "wrong-token":
            token = "x" * 43
        if change == "other-origin":
            headers = {"origin": "http://127.0.0.1:1", "sec-fetch-site": "same-site"}
        if change == "no-origin":
            headers = {}
        form = {"credential": ADMIN, "csrf_token": token}
        assert_page(client.post("/console/login", data=form, headers=headers), 403, why)


def test_pages_without_a_session_go_to_the_login_page(world: World) -> None:
    with world.client() as client:
        for path in ["/console", "/console/overview", "/console/tenants/acme", "/console/nope"]:
            answer = client.get(path)
            assert answer.status_code == 303 and answer.headers["location"] == "/console/login"
        fragment = client.get("/console/fragments/requests", headers={"hx-request": "true"})
        assert fragment.status_code == 200 and fragment.text == ""  # nothing to swap in
        assert fragment.headers["hx-redirect"] == "/console/login"
        post = client.post("/console/keys/abc/revoke", data={}, headers=world.origin)
        assert post.headers["location"] == "/console/login"


@pytest.mark.parametrize("change", ["no-token", "wrong-token", "other-origin", "no-origin"])
def test_a_state_changing_form_without_its_csrf_proofs_is_refused(
    world: World, change: str
) -> None:
    _, key_id = new_key(world, "acme", console=False)
    with world.client() as client:
        login(world, client, ADMIN)
        form = {"csrf_token": csrf_of(client.get("/console/tenants/acme"))}
        headers = dict(world.origin)
        if change == "no-token":
            form = {}
        if change == "wrong-token":
            form = {"csrf_token": "y" * 43}
        if change == "other-origin":
            headers = {"origin": "http://evil.example", "sec-fetch-site": "cross-site"}
        if change == "no-origin":
            headers = {}
        answer = client.post(f"/console/keys/{key_id}/revoke", data=form, headers=headers)
        assert_page(answer, 403, "Refused")
    assert admin_api(world, "GET", f"/admin/keys/{key_id}").json()["status"] == "active"


def test_a_tenant_admin_cannot_reach_another_tenant_by_editing_urls(world: World) -> None:
    key, _ = new_key(world, "acme", console=True)
    _, globex_key = new_key(world, "globex", console=False)
    with world.client() as client:
        assert login(world, client, key).status_code == 303
        assert client.get("/console/tenants").headers["location"] == "/console/tenants/acme"
        assert_page(client.get("/console/tenants/acme"), 200, "Tenant acme")
        for path in [
            "/console/tenants/globex",
            "/console/tenants/nobody",
            "/console/targets",
            "/console/routing",
            "/console/fragments/targets",
            "/console/fragments/explain?model=chat",
            "/console/usage?tenant=globex",
            "/console/usage/export?tenant=globex&format=csv",
            "/console/requests?tenant=globex",
            "/console/fragments/requests?tenant=globex",
        ]:
            assert_page(client.get(path), 404, "There is no such page.")
        form = {"csrf_token": csrf_of(client.get("/console/tenants/acme"))}
        for action in ["revoke", "rotate"]:
            answer = client.post(f"/console/keys/{globex_key}/{action}", data=form,
                                 headers=world.origin)  # fmt: skip
            assert_page(answer, 404, "There is no such page.")
        for tenant_path in ["/console/tenants/globex/keys", "/console/tenants/acme/settings"]:
            answer = client.post(tenant_path, data=form, headers=world.origin)
            assert_page(answer, 404, "There is no such page.")
    assert admin_api(world, "GET", f"/admin/keys/{globex_key}").json()["status"] == "active"


def test_a_session_ends_when_its_key_is_revoked_or_rotated(world: World) -> None:
    for change in ["revoke", "rotate"]:
        key, key_id = new_key(world, "acme", console=True)
        with world.client() as client:
            login(world, client, key)
            assert client.get("/console/tenants/acme").status_code == 200
            body = {"grace_seconds": 0} if change == "rotate" else None
            assert admin_api(world, "POST", f"/admin/keys/{key_id}/{change}", body).is_success
            answer = client.get("/console/tenants/acme")
            assert answer.status_code == 303 and answer.headers["location"] == "/console/login"


def test_a_key_that_loses_the_role_loses_the_console(world: World) -> None:
    key, key_id = new_key(world, "acme", console=True)
    with world.client() as client:
        login(world, client, key)
        assert admin_api(world, "PATCH", f"/admin/keys/{key_id}", {"metadata": {}}).is_success
        assert client.get("/console/overview").headers["location"] == "/console/login"


def test_logout_ends_the_session_everywhere(world: World) -> None:
    with world.client() as client:
        login(world, client, ADMIN)
        session = client.cookies["sy_console"]
        form = {"csrf_token": csrf_of(client.get("/console/overview"))}
        answer = client.post("/console/logout", data=form, headers=world.origin)
        assert answer.status_code == 303 and answer.headers["location"] == "/console/login"
    with world.client() as other:
        other.cookies.set("sy_console", session, path="/console")
        assert other.get("/console/overview").headers["location"] == "/console/login"


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ("/console/overview?range=2d", "range must be one of 15m, 1h, 6h"),
        ("/console/api/timeline?range=2d", "range must be one of 15m, 1h, 6h"),
        ("/console/usage?from=yesterday", "&#39;from&#39; must be an ISO 8601 date"),
        ("/console/usage/export?format=xml", "&#39;format&#39; must be one of csv, jsonl"),
        ("/console/requests?status=teapot", "status must be ok, error or a 3-digit code"),
    ],
)
def test_bad_query_values_are_400_pages_naming_them(world: World, path: str, text: str) -> None:
    with world.client() as client:
        login(world, client, ADMIN)
        assert_page(client.get(path), 400, text)


@pytest.mark.parametrize(
    ("path", "form", "status", "text"),
    [
        ("/console/tenants/acme/keys", {"expires_in_days": "-1"}, 400, "expires_in_days must be"),
        ("/console/tenants/acme/keys", {"allowed_models": "nope"}, 400, "Unknown model alias"),
        ("/console/tenants/acme/keys", {"name": "x" * 201}, 400, "Invalid key"),
        ("/console/tenants/nobody/keys", {}, 404, "No tenant named"),
        ("/console/tenants/acme/settings", {"rpm": "1.5"}, 400, "rpm must be a whole number"),
        ("/console/tenants/acme/settings", {"usd_per_day": "x"}, 400, "usd_per_day must be"),
        ("/console/tenants/acme/settings", {"models": "ghost"}, 400, "unknown model alias"),
        ("/console/keys/000000000000/revoke", {}, 404, "No API key with id"),
    ],
)
def test_bad_form_values_are_error_pages(
    world: World, path: str, form: dict[str, str], status: int, text: str
) -> None:
    with world.client() as client:
        login(world, client, ADMIN)
        form = {**form, "csrf_token": csrf_of(client.get("/console/tenants/acme"))}
        assert_page(client.post(path, data=form, headers=world.origin), status, text)


def test_a_revoked_key_cannot_be_revoked_again(world: World) -> None:
    _, key_id = new_key(world, "acme", console=False)
    with world.client() as client:
        login(world, client, ADMIN)
        form = {"csrf_token": csrf_of(client.get("/console/tenants/acme"))}
        path = f"/console/keys/{key_id}/revoke"
        assert client.post(path, data=form, headers=world.origin).status_code == 303
        assert_page(client.post(path, data=form, headers=world.origin), 409, "is revoked")


def test_an_unreachable_session_store_is_a_503_page(
    request: pytest.FixtureRequest, redis_server: RedisServer, tmp_path: Path
) -> None:
    for gateway in _gateway(tmp_path, _state(request, "redis"), control=True):
        world = World(gateway, "redis")
        with world.client() as client:
            login(world, client, ADMIN)
            redis_server.stop()
            try:
                assert_page(client.get("/console/overview"), 503, "shared store is unreachable")
                assert_page(client.get("/console/login"), 503, "shared store is unreachable")
            finally:
                redis_server.start()


def test_static_files_and_unknown_paths(world: World) -> None:
    with world.client() as client:
        script = client.get("/console/static/console.js")
        assert script.status_code == 200 and "javascript" in script.headers["content-type"]
        assert script.headers["x-content-type-options"] == "nosniff"
        vendor = client.get("/console/static/vendor/htmx-2.0.11.min.js")
        assert vendor.status_code == 200 and len(vendor.content) > 40_000
        login(world, client, ADMIN)
        assert_page(client.get("/console/static/nope.js"), 404, "no file or directory match")
        assert_page(client.get("/console/nope"), 404, "There is no such page.")
        document = client.get("/openapi.json").json()
        assert not [p for p in document["paths"] if p.startswith("/console")]


def test_without_a_control_plane_keys_are_read_only(tmp_path: Path) -> None:
    for gateway in _gateway(tmp_path, "{backend: memory}", control=False):
        world = World(gateway, "memory")
        with world.client() as client:
            login(world, client, ADMIN)
            page = client.get("/console/tenants/acme")
            assert_page(page, 200, "Keys are managed with <code>switchyard keys</code>")
            form = {"csrf_token": csrf_of(page)}
            answer = client.post("/console/tenants/acme/keys", data=form, headers=world.origin)
            assert_page(answer, 400, "This gateway has no control plane")
