"""Tenants over real HTTP with the openai SDK and raw httpx: the auth matrix, model
allow-lists, x-ratelimit headers, and usage exports scoped to the caller. A request that
fails authentication, authorisation or validation leaves no ledger row."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import jwt
import openai
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from policies.auth import KeysFile
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-0123456789abcdef"
SECRET = "s" * 48
ISSUER, AUDIENCE = "https://idp.example", "switchyard"


@dataclass
class World:
    gateway: Gateway
    keys: KeysFile
    acme_key: str
    globex_key: str
    private_pem: bytes


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("tenants")
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (folder / "jwt.pem").write_bytes(public_pem)
    keys = KeysFile(folder / "keys.json")
    acme_key, _ = keys.create("acme", "ci")
    globex_key, _ = keys.create("globex", "ci")
    upstream = FakeOpenAI()
    with serve(upstream) as up:
        config = f"""
auth:
  admin_key_env: T_ADMIN
  keys_file: {folder / "keys.json"}
  jwt:
    algorithms: [HS256, RS256]
    secret_env: T_JWT_SECRET
    public_key_file: {folder / "jwt.pem"}
    issuer: {ISSUER}
    audience: {AUDIENCE}
tenants:
  acme: {{limits: {{rpm: 1000, tpm: 100000}}, models: [chat]}}
  globex: {{limits: {{rpm: 500}}}}
ledger: {{path: {folder / "usage.sqlite3"}}}
providers:
  oa: {{type: openai, base_url: "{up.url}/v1", api_key_env: T_OA}}
models:
  chat: {{targets: [{{provider: oa, model: m-count}}]}}
  json: {{targets: [{{provider: oa, model: m-json}}]}}
"""
        env = {"T_ADMIN": ADMIN, "T_JWT_SECRET": SECRET, "T_OA": "sk-upstream"}
        with running_gateway(config, env) as gateway:
            yield World(gateway, keys, acme_key, globex_key, private_pem)


def chat(
    gateway: Gateway, token: str | None, model: str = "chat", text: str = "hi"
) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    return httpx.post(gateway.base_url + "/chat/completions", json=body, headers=headers)


def rows(
    gateway: Gateway, token: str = ADMIN, path: str = "/admin/usage", **params: str
) -> list[dict]:
    answer = httpx.get(
        gateway.url + path, params=params, headers={"authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 200, answer.text
    return [json.loads(line) for line in answer.text.splitlines() if line]


def token(claims: dict, key: str | bytes = SECRET, alg: str = "HS256", **headers: str) -> str:
    now = int(time.time())
    payload = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "svc-1",
        "tenant": "acme",
        "iat": now,
        "exp": now + 300,
        **claims,
    }
    return jwt.encode(
        {k: v for k, v in payload.items() if v is not None},
        key,
        algorithm=alg,
        headers=headers or None,
    )


def assert_auth_error(answer: httpx.Response, status: int = 401) -> None:
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["type"] == ("authentication_error" if status == 401 else "permission_error")
    assert answer.headers["x-request-id"]
    assert "sk-upstream" not in answer.text and SECRET not in answer.text


def test_valid_key_is_served_with_ratelimit_headers(world: World) -> None:
    client = openai.OpenAI(base_url=world.gateway.base_url, api_key=world.acme_key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": "hello"}]
    )
    assert raw.parse().choices[0].message.content == "Hello from openai!"
    assert raw.headers["x-ratelimit-limit-requests"] == "1000"
    assert int(raw.headers["x-ratelimit-remaining-requests"]) < 1000
    assert raw.headers["x-ratelimit-limit-tokens"] == "100000"
    assert raw.headers["x-ratelimit-reset-requests"]


@pytest.mark.parametrize(
    "credential",
    [None, "sy-000000000000-not-a-real-key", "garbage", "Basic abc"],
    ids=["missing", "unknown-key", "malformed", "odd"],
)
def test_bad_api_keys_get_401(world: World, credential: str | None) -> None:
    assert_auth_error(chat(world.gateway, credential))


def status_within(gateway: Gateway, key: str, wanted: int, seconds: float = 10) -> int:
    """Poll until the key gets ``wanted`` (the keys file is re-read within ~1 s)."""
    deadline = time.monotonic() + seconds
    status = chat(gateway, key).status_code
    while time.monotonic() < deadline and status != wanted:
        time.sleep(0.2)
        status = chat(gateway, key).status_code
    return status


def test_new_and_revoked_keys_take_effect_without_a_restart(world: World) -> None:
    key, record = world.keys.create("acme", "short-lived")
    assert status_within(world.gateway, key, 200) == 200
    world.keys.revoke(record.key_id)
    assert status_within(world.gateway, key, 401) == 401


def test_valid_jwts_are_served(world: World) -> None:
    assert chat(world.gateway, token({})).status_code == 200
    assert chat(world.gateway, token({}, world.private_pem, "RS256")).status_code == 200


@pytest.mark.parametrize(
    "case",
    [
        "expired",
        "wrong-signature",
        "alg-none",
        "hs-rs-confusion",
        "wrong-audience",
        "wrong-issuer",
        "missing-tenant",
        "unknown-tenant",
        "not-yet-valid",
    ],
)
def test_bad_jwts_get_401(world: World, case: str) -> None:
    now = int(time.time())
    public_pem = Path(
        world.gateway.app.state.gateway.runtime.config.auth.jwt.public_key_file
    ).read_bytes()
    tokens = {
        "expired": lambda: token({"exp": now - 3600, "iat": now - 7200}),
        "wrong-signature": lambda: token({}, "x" * 48),
        "alg-none": lambda: jwt.encode(
            {"iss": ISSUER, "aud": AUDIENCE, "sub": "s", "tenant": "acme", "exp": now + 60},
            None,
            algorithm="none",
        ),
        "hs-rs-confusion": lambda: _hs_signed_with(public_pem, now),
        "wrong-audience": lambda: token({"aud": "someone-else"}),
        "wrong-issuer": lambda: token({"iss": "https://evil.example"}),
        "missing-tenant": lambda: token({"tenant": None}),
        "unknown-tenant": lambda: token({"tenant": "initech"}),
        "not-yet-valid": lambda: token({"nbf": now + 3600}),
    }
    assert_auth_error(chat(world.gateway, tokens[case]()))


def _hs_signed_with(public_pem: bytes, now: int) -> str:
    """HS256 with the RSA public key as the HMAC secret: the classic algorithm confusion.
    pyjwt refuses to do this itself, so the token is assembled by hand."""
    import base64
    import hashlib
    import hmac

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    header = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "s", "tenant": "acme", "exp": now + 60}
    body = b64(json.dumps(claims).encode())
    signature = hmac.new(public_pem, f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{b64(signature)}"


def test_model_outside_the_allow_list_is_403(world: World) -> None:
    answer = chat(world.gateway, world.acme_key, model="json")
    assert_auth_error(answer, 403)
    assert answer.json()["error"]["param"] == "model"
    assert chat(world.gateway, world.globex_key, model="json").status_code == 200


def test_failed_requests_leave_no_ledger_row(world: World) -> None:
    before = rows(world.gateway)
    chat(world.gateway, None)
    chat(world.gateway, world.acme_key, model="json")  # 403
    chat(world.gateway, world.acme_key, model="nope")  # 404
    httpx.post(
        world.gateway.base_url + "/chat/completions",
        content=b"{not json",
        headers={"authorization": f"Bearer {world.acme_key}"},
    )  # 400
    assert rows(world.gateway) == before


def test_usage_export_is_scoped_to_the_callers_tenant(world: World) -> None:
    chat(world.gateway, world.acme_key, text="acme's question")
    chat(world.gateway, world.globex_key, text="globex's question, longer")
    acme = rows(world.gateway, world.acme_key, "/v1/usage")
    globex = rows(world.gateway, world.globex_key, "/v1/usage")
    assert acme and {r["SubAccountId"] for r in acme} == {"acme"}
    assert globex and {r["SubAccountId"] for r in globex} == {"globex"}
    everything = rows(world.gateway)
    assert {r["request_id"] for r in everything} >= {r["request_id"] for r in acme + globex}
    other = httpx.get(
        world.gateway.url + "/v1/usage",
        params={"tenant": "globex"},
        headers={"authorization": f"Bearer {world.acme_key}"},
    )
    assert_auth_error(other, 403)
    admin_only = httpx.get(
        world.gateway.url + "/admin/usage", headers={"authorization": f"Bearer {world.acme_key}"}
    )
    assert_auth_error(admin_only, 403)
    assert httpx.get(world.gateway.url + "/v1/usage").status_code == 401


def test_models_list_needs_credentials_and_shows_the_tenants_aliases(world: World) -> None:
    url = world.gateway.base_url + "/models"
    assert_auth_error(httpx.get(url))
    acme = httpx.get(url, headers={"authorization": f"Bearer {world.acme_key}"}).json()
    assert [m["id"] for m in acme["data"]] == ["chat"]
    globex = httpx.get(url, headers={"authorization": f"Bearer {world.globex_key}"}).json()
    assert [m["id"] for m in globex["data"]] == ["chat", "json"]
    hidden = httpx.get(url + "/json", headers={"authorization": f"Bearer {world.acme_key}"})
    assert hidden.status_code == 404
