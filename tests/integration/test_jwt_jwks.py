"""JWTs from an identity provider's JWKS, end to end: a real gateway over HTTP, the official
openai SDK carrying the IdP's token as its api_key, and a local IdP (discovery document and
JWKS on 127.0.0.1, tests/fixtures/jwks_server.py) that rotates keys, fails and hangs.

Covers: a rotated key verifies on its first request without a restart; refusals are 401s in
OpenAI's error shape; a hanging IdP does not stall tokens with known kids; a reload to
another IdP replaces the key source and closes the old one; a discovery document without
``jwks_uri`` fails the start (``/readyz``) and a reload (400) with a clear message."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from core.config import load_config
from gateway.app import create_app
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.jwks_server import JWKS, LocalIdP, SigningKey, running_idp
from tests.fixtures.server import ServerThread, serve
from tests.integration.gateway_harness import with_private_ledger

ADMIN = "sy-admin-jwks-test"
AUDIENCE = "switchyard"
COOLDOWN_S = 0.05
ENV = {"T_OA": "sk-upstream", "T_ADMIN": ADMIN}


def policy(upstream: str, idp: LocalIdP, *, discovery: bool = True, timeout_s: float = 30) -> str:
    source = f"issuer: {idp.issuer}, discovery: true" if discovery else f"jwks_url: {idp.jwks_url}"
    return f"""
auth:
  admin_key_env: T_ADMIN
  jwt: {{algorithms: [RS256, ES256], {source}, audience: {AUDIENCE},
        jwks_cooldown_s: {COOLDOWN_S}, jwks_timeout_s: {timeout_s}}}
tenants:
  acme: {{models: [chat]}}
providers:
  oa: {{type: openai, base_url: "{upstream}/v1", api_key_env: T_OA}}
models:
  chat: {{targets: [{{provider: oa, model: m-ok}}]}}
"""


@contextmanager
def gateway_for(path: Path, text: str) -> Iterator[str]:
    """A gateway started from the policy file ``path`` (so it can reload); yields its URL."""
    path.write_text(text)
    server = ServerThread(create_app(with_private_ledger(load_config(path)), env=ENV)).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with serve(FakeOpenAI()) as server:
        yield server.url


@pytest.fixture(scope="module")
def keys() -> dict[str, SigningKey]:
    return {
        "a": SigningKey.rsa("a"),
        "b": SigningKey.ec("b"),
        "c": SigningKey.rsa("c"),
        "x": SigningKey.rsa("x"),
    }


@dataclass
class World:
    url: str
    idp: LocalIdP


@pytest.fixture(scope="module")
def world(tmp_path_factory, upstream, keys) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("jwks")
    with (
        running_idp(keys["a"]) as idp,
        gateway_for(folder / "policy.yaml", policy(upstream, idp)) as url,
    ):
        yield World(url, idp)


@pytest.fixture
def idp(world) -> Iterator[LocalIdP]:
    """The world's IdP, a cooldown after any earlier fetch, put back as it was after."""
    time.sleep(COOLDOWN_S * 2)  # an unknown kid may fetch again
    yield world.idp
    world.idp.jwks_mode = world.idp.discovery_mode = "ok"


def claims(idp: LocalIdP, **extra) -> dict:
    now = int(time.time())
    base = {"iss": idp.issuer, "aud": AUDIENCE, "tenant": "acme", "sub": "svc", "exp": now + 300}
    return {k: v for k, v in {**base, **extra}.items() if v is not None}


def ask(url: str, token: str, timeout_s: float = 10.0) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0, timeout=timeout_s)
    reply = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}]
    )
    return reply.choices[0].message.content or ""


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(header: dict, payload: dict, secret: bytes | None = None) -> str:
    head, body = b64(json.dumps(header).encode()), b64(json.dumps(payload).encode())
    if secret is None:
        return f"{head}.{body}."
    mac = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(mac)}"


def test_the_openai_sdk_authenticates_with_an_idp_token(world, idp, keys):
    assert ask(world.url, keys["a"].sign(claims(idp))) == "Hello from openai!"


def test_a_rotated_key_verifies_on_its_first_request(world, idp, keys):
    before = idp.hits[JWKS]
    idp.keys = [keys["a"], keys["b"]]  # the IdP publishes B (EC) and signs with it
    try:
        assert ask(world.url, keys["b"].sign(claims(idp, sub="b"))) == "Hello from openai!"
        assert idp.hits[JWKS] == before + 1
    finally:
        idp.keys = [keys["a"]]


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(lambda idp, k: k["a"].sign(claims(idp, iss="https://evil")), id="issuer"),
        pytest.param(lambda idp, k: k["a"].sign(claims(idp, aud="other")), id="audience"),
        pytest.param(lambda idp, k: k["a"].sign(claims(idp, exp=1_000_000)), id="expired"),
        pytest.param(lambda idp, k: k["x"].sign(claims(idp)), id="unknown-kid"),
        pytest.param(lambda idp, k: k["x"].sign(claims(idp), kid="a"), id="wrong-signature"),
        pytest.param(
            lambda idp, k: unsigned({"alg": "none", "kid": "a"}, claims(idp)), id="alg-none"
        ),
        pytest.param(
            lambda idp, k: unsigned(
                {"alg": "HS256", "kid": "a"}, claims(idp), json.dumps(k["a"].jwk()).encode()
            ),
            id="hs256-with-the-jwk",
        ),
    ],
)
def test_refusals_are_openai_shaped_401s(world, idp, keys, forge):
    token = forge(idp, keys)
    with pytest.raises(openai.AuthenticationError) as info:
        ask(world.url, token)
    error = info.value.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
    assert error["message"] == "Invalid or expired token."


def test_a_hanging_idp_does_not_stall_known_kids(world, idp, keys):
    idp.jwks_mode = "hang"
    refused: list[int] = []
    unknown = keys["x"].sign(claims(idp))
    waiter = threading.Thread(
        target=lambda: refused.append(
            httpx.get(
                world.url + "/v1/models",
                headers={"authorization": f"Bearer {unknown}"},
                timeout=60,
            ).status_code
        )
    )
    waiter.start()
    deadline = time.monotonic() + 10
    while idp.hanging < 1:  # the unknown kid's fetch is held by the IdP
        assert time.monotonic() < deadline, "the gateway never asked the IdP"
        time.sleep(0.01)
    # jwks_timeout_s is 30: a request that waited on the IdP would outlast this 5 s timeout
    for n in range(5):
        assert ask(world.url, keys["a"].sign(claims(idp, sub=f"s{n}")), 5.0) == "Hello from openai!"
    assert waiter.is_alive()
    idp.jwks_mode = "ok"
    waiter.join(timeout=20)
    assert refused == [401]


def test_a_reload_to_another_idp_replaces_and_closes_the_key_source(tmp_path, upstream, keys):
    with running_idp(keys["a"]) as first, running_idp(keys["c"]) as second:
        first.cache_control = second.cache_control = "max-age=0"  # refreshed every cooldown
        path = tmp_path / "policy.yaml"
        with gateway_for(path, policy(upstream, first, discovery=False)) as url:
            assert ask(url, keys["a"].sign(claims(first))) == "Hello from openai!"
            path.write_text(policy(upstream, second))
            answer = httpx.post(url + "/admin/reload", headers={"authorization": f"Bearer {ADMIN}"})
            assert answer.status_code == 200, answer.text
            closed_at = first.hits[JWKS]
            assert ask(url, keys["c"].sign(claims(second))) == "Hello from openai!"
            with pytest.raises(openai.AuthenticationError):
                ask(url, keys["a"].sign(claims(first)))
            seen = second.hits[JWKS]
            deadline = time.monotonic() + 10
            while second.hits[JWKS] < seen + 3:  # several refresh periods of the new source
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert first.hits[JWKS] <= closed_at + 1  # the old refresher stopped (one may race)


def test_discovery_without_jwks_uri_fails_the_start_and_a_reload(tmp_path, upstream, keys):
    with running_idp(keys["a"]) as good, running_idp(keys["c"]) as broken:
        broken.discovery = {"issuer": broken.issuer}
        path = tmp_path / "policy.yaml"
        with gateway_for(path, policy(upstream, broken)) as url:
            deadline = time.monotonic() + 10
            while (ready := httpx.get(url + "/readyz").json())["status"] == "starting":
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert ready["status"] == "failed"
            assert "has no http(s) jwks_uri" in ready["error"]
        with gateway_for(path, policy(upstream, good)) as url:
            path.write_text(policy(upstream, broken))
            answer = httpx.post(url + "/admin/reload", headers={"authorization": f"Bearer {ADMIN}"})
            assert answer.status_code == 400
            assert answer.json()["error"]["code"] == "invalid_config"
            assert "has no http(s) jwks_uri" in answer.json()["error"]["message"]
            assert ask(url, keys["a"].sign(claims(good))) == "Hello from openai!"
