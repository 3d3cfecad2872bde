"""Issue 10, defects 5 to 8, over real HTTP against a gateway with tenants: usage-export
query parameters, the Retry-After the gateway passes on, JWT ``iat`` and size, and ``n`` in
the admission estimate. Every refusal is in OpenAI's error shape."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
import pytest

from policies.auth import KeysFile
from tests.fixtures.asgi import read_request, send_json
from tests.fixtures.fake_openai import FakeOpenAI, error_payload
from tests.fixtures.redis_server import RedisServer
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-hardening-0123456789"
SECRET = "h" * 48
FAR_FUTURE = email.utils.formatdate(time.time() + 10 * 365 * 86400, usegmt=True)


class RateLimitingUpstream(FakeOpenAI):
    """The fake OpenAI API, except under ``/huge`` and ``/date``: every call there is a 429
    whose Retry-After is absurd (999999 seconds, or an HTTP date ten years ahead)."""

    WAITS = {"/huge/": "999999", "/date/": FAR_FUTURE}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        wait = next((w for p, w in self.WAITS.items() if scope["path"].startswith(p)), None)
        if scope["type"] != "http" or wait is None:
            await super().__call__(scope, receive, send)
            return
        self.requests.append(await read_request(scope, receive))
        payload = error_payload(429, "rate_limit_exceeded", "Rate limit reached")
        await send_json(send, 429, payload, {"retry-after": wait})


@dataclass
class World:
    gateway: Gateway
    upstream: RateLimitingUpstream
    key: str


@pytest.fixture(scope="module", params=["memory", "redis"])
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    """One gateway per state backend: SQLite ledger and in-process quotas, or a Redis
    Stream ledger and Lua quotas (each with its own key prefix)."""
    folder = tmp_path_factory.mktemp("hardening")
    state = "{backend: memory}"
    if request.param == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")
        redis.start()
        state = f"{{backend: redis, redis: {{url: '{redis.url}', key_prefix: '{folder.name}:'}}}}"
    keys = KeysFile(folder / "keys.json")
    key, _ = keys.create("acme", "ci")
    upstream = RateLimitingUpstream()
    with serve(upstream) as up:
        config = f"""
auth:
  admin_key_env: T_ADMIN
  keys_file: {folder / "keys.json"}
  jwt: {{algorithms: [HS256], secret_env: T_JWT_SECRET}}
tenants:
  acme: {{limits: {{rpm: 10000, tpm: 5000}}}}
ledger: {{path: {folder / "usage.sqlite3"}}}
state: {state}
routing: {{max_attempts_per_target: 3, retry_backoff_s: 0.01}}
providers:
  oa: {{type: openai, base_url: "{up.url}/v1", api_key_env: T_OA}}
  huge: {{type: openai, base_url: "{up.url}/huge/v1", api_key_env: T_OA}}
  date: {{type: openai, base_url: "{up.url}/date/v1", api_key_env: T_OA}}
models:
  chat: {{targets: [{{provider: oa, model: m-count}}]}}
  huge-wait: {{targets: [{{provider: huge, model: m}}]}}
  date-wait: {{targets: [{{provider: date, model: m}}, {{provider: huge, model: m}}]}}
"""
        env = {"T_ADMIN": ADMIN, "T_JWT_SECRET": SECRET, "T_OA": "sk-upstream"}
        with running_gateway(config, env) as gateway:
            yield World(gateway, upstream, key)


def chat(world: World, credential: str | None = None, **fields: Any) -> httpx.Response:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], **fields}
    headers = {"authorization": f"Bearer {credential or world.key}"}
    return httpx.post(
        world.gateway.base_url + "/chat/completions", json=body, headers=headers, timeout=30
    )


def assert_openai_error(answer: httpx.Response, status: int, param: str | None = None) -> dict:
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    assert answer.headers["x-request-id"]
    return error


# ---------------------------------------------------------------- 5: usage query parameters

BAD_TIMES = [
    "1e308",
    "-1e20",
    "-1",
    "inf",
    "nan",
    "1e20",
    "99999999999999999999",
    "9999-12-31T23:59:59-23:59",
    "0001-01-01T00:00:00+01:00",
    "2024-13-01",
    "%00",
    "tomorrow",
    "2024-05-01T25:00:00",
]


@pytest.mark.parametrize("path", ["/v1/usage", "/admin/usage"])
@pytest.mark.parametrize("param", ["from", "to"])
@pytest.mark.parametrize("value", BAD_TIMES)
def test_bad_usage_times_are_400_naming_the_parameter(
    world: World, path: str, param: str, value: str
) -> None:
    credential = ADMIN if path == "/admin/usage" else world.key
    answer = httpx.get(
        world.gateway.url + path,
        params={param: value},
        headers={"authorization": f"Bearer {credential}"},
    )
    error = assert_openai_error(answer, 400, param)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("group_by=week", "group_by"),
        ("format=xml", "format"),
        ("format=%ff", "format"),
        ("group_by=%00", "group_by"),
        ("from=%ff%fe", "from"),
    ],
)
def test_other_bad_usage_parameters_are_400(world: World, query: str, param: str) -> None:
    answer = httpx.get(
        world.gateway.url + "/v1/usage?" + query, headers={"authorization": f"Bearer {world.key}"}
    )
    assert_openai_error(answer, 400, param)


@pytest.mark.parametrize(
    "query",
    [
        "from=0",
        "to=9999-12-31",
        "from=1970-01-01&to=9999-12-31T23:59:59Z",
        "limit=-1",
        "limit=1e400",
        "from=2024-05-01&from=1e308",
        "tenant=" + "x" * 5000,
    ],
)
def test_edge_but_valid_usage_queries_are_200(world: World, query: str) -> None:
    answer = httpx.get(
        world.gateway.url + "/admin/usage?" + query, headers={"authorization": f"Bearer {ADMIN}"}
    )
    assert answer.status_code == 200, answer.text


# ---------------------------------------------------------------- 6: Retry-After


@pytest.mark.parametrize("model", ["huge-wait", "date-wait"])
def test_absurd_upstream_retry_after_is_capped_for_the_client(world: World, model: str) -> None:
    before = len(world.upstream.requests)
    started = time.monotonic()
    answer = chat(world, model=model)
    error = assert_openai_error(answer, 429)
    assert error["type"] == "rate_limit_error"
    assert answer.headers["retry-after"] == "60"  # routing.max_client_retry_after_s
    # the executor did not wait on a target that asked for days: one call per target
    assert time.monotonic() - started < 5
    targets = 1 if model == "huge-wait" else 2
    assert len(world.upstream.requests) - before == targets


# ---------------------------------------------------------------- 7: JWT


def token(**claims: Any) -> str:
    now = int(time.time())
    payload = {"sub": "svc-1", "tenant": "acme", "iat": now, "exp": now + 300, **claims}
    return jwt.encode(payload, SECRET, algorithm="HS256")


def test_jwt_issued_in_the_future_is_401(world: World) -> None:
    assert chat(world, token()).status_code == 200
    future = token(iat=int(time.time()) + 3600, exp=int(time.time()) + 7200)
    error = assert_openai_error(chat(world, future), 401)
    assert error["type"] == "authentication_error"


def test_oversized_jwt_is_401(world: World) -> None:
    """Over auth.jwt.max_token_bytes (16 KiB) but under any server header limit (the 256 KiB
    token of the report is in tests/unit/test_hardening_jwt.py)."""
    padded = token(pad="x" * 20 * 1024)
    assert 16 * 1024 < len(padded) < 32 * 1024
    error = assert_openai_error(chat(world, padded), 401)
    assert error["type"] == "authentication_error"
    assert chat(world, token(pad="x" * 8 * 1024)).status_code == 200


# ---------------------------------------------------------------- 8: n in the admission estimate


def test_n_counts_in_the_token_reservation(world: World) -> None:
    """tpm 5000: 100 tokens for one answer fit, for 60 answers (6000) they do not."""
    assert chat(world, max_tokens=100, n=1).status_code == 200
    assert chat(world, max_tokens=100, n=40).status_code == 200
    error = assert_openai_error(chat(world, max_tokens=100, n=60), 429)
    assert error["type"] == "rate_limit_error"
    assert "6" in error["message"]  # the message names what the request needs


def test_n_above_the_cap_is_400(world: World) -> None:
    assert_openai_error(chat(world, max_tokens=1, n=129), 400, "n")
    assert_openai_error(chat(world, max_tokens=1, n=10**30), 400, "n")


def test_absurd_max_tokens_is_400_not_500(world: World) -> None:
    assert_openai_error(chat(world, max_tokens=10**400), 400, "max_tokens")
    assert_openai_error(chat(world, max_completion_tokens=10**400), 400, "max_completion_tokens")
