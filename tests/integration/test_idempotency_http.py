"""``Idempotency-Key`` over real HTTP: a real gateway (two tenants, API keys) in front of fake
OpenAI and Anthropic upstreams, driven by the official SDKs and by httpx for raw bytes.

A key runs its request once: concurrent retries wait for it and get the same answer, a
retry after the client left gets the answer of the run that went on without it, streams
are replayed byte for byte, and the ledger has one row. A different body under the key is
a 422 in the path's dialect; failures are not stored; keys expire; tenants have their own
keys. Memory and Redis state both.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from policies.auth import KeysFile
from tests.fixtures.fake_anthropic import FakeAnthropic
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.redis_server import RedisServer
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-idempotency-0123456789"
REPLAYED = "idempotent-replayed"
SLOW_S = 1.0  # how long the fake upstreams' m-slow waits


@dataclass
class World:
    gateway: Gateway
    openai: FakeOpenAI
    anthropic: FakeAnthropic
    acme: str
    globex: str


@contextmanager
def world_of(folder: Path, extra: str = "") -> Iterator[World]:
    """Fakes and a gateway; ``extra`` adds config sections (state, idempotency)."""
    keys = KeysFile(folder / "keys.json")
    acme, _ = keys.create("acme", "ci")
    globex, _ = keys.create("globex", "ci")
    fake_openai, fake_anthropic = FakeOpenAI(), FakeAnthropic(slow_seconds=SLOW_S)
    fake_openai.slow_seconds = SLOW_S
    with serve(fake_openai) as oa, serve(fake_anthropic) as an:
        config = f"""
auth: {{admin_key_env: T_ADMIN, keys_file: {folder / "keys.json"}}}
tenants: {{acme: {{}}, globex: {{}}}}
ledger: {{path: {folder / "usage.sqlite3"}, spool_path: {folder / "spool.sqlite3"}}}
routing: {{max_attempts_per_target: 1}}
{extra}
providers:
  oa: {{type: openai, base_url: "{oa.url}/v1", api_key_env: T_OA}}
  an: {{type: anthropic, base_url: "{an.url}", api_key_env: T_AN}}
models:
  chat: {{targets: [{{provider: oa, model: m-ok}}]}}
  slow: {{targets: [{{provider: oa, model: m-slow}}]}}
  flaky: {{targets: [{{provider: oa, model: m-flaky}}]}}
  broken-stream: {{targets: [{{provider: oa, model: m-stream-error}}]}}
  embed: {{targets: [{{provider: oa, model: text-embedding-3-small}}]}}
  claude: {{targets: [{{provider: an, model: m-ok}}]}}
"""
        env = {"T_ADMIN": ADMIN, "T_OA": "sk-oa", "T_AN": "sk-an"}
        with running_gateway(config, env) as gateway:
            yield World(gateway, fake_openai, fake_anthropic, acme, globex)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with world_of(tmp_path_factory.mktemp("idempotency")) as built:
        yield built


@pytest.fixture(scope="module")
def redis_world(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[World]:
    redis_server.start()
    state = f"state: {{backend: redis, redis: {{url: '{redis_server.url}', key_prefix: 'idem:'}}}}"
    with world_of(tmp_path_factory.mktemp("idempotency-redis"), state) as built:
        yield built


@pytest.fixture(params=["memory", "redis"])
def any_world(request: pytest.FixtureRequest) -> World:
    return request.getfixturevalue("world" if request.param == "memory" else "redis_world")


# -- helpers ---------------------------------------------------------------------------------


def fresh() -> str:
    """A text (and key) no other test uses: upstream calls and rows are counted by it."""
    return uuid.uuid4().hex


def calls(fake: FakeOpenAI | FakeAnthropic, text: str) -> int:
    """Upstream requests whose body carries ``text``."""
    return sum(1 for r in fake.requests if text in json.dumps(r.json))


def chat(text: str, model: str = "chat", **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **fields}


def post(
    world: World,
    path: str,
    body: dict[str, Any],
    key: str | None,
    token: str | None = None,
    timeout: float = 30,
    **headers: str,
) -> httpx.Response:
    """POST ``body`` as acme (or ``token``) with ``key`` (None: no header)."""
    sent = {"authorization": f"Bearer {token or world.acme}", **headers}
    if key is not None:
        sent["idempotency-key"] = key
    return httpx.post(world.gateway.url + path, json=body, headers=sent, timeout=timeout)


def rows(world: World, client_request_id: str) -> list[dict[str, Any]]:
    answer = httpx.get(
        world.gateway.url + "/admin/usage", headers={"authorization": f"Bearer {ADMIN}"}
    )
    assert answer.status_code == 200, answer.text
    every = [json.loads(line) for line in answer.text.splitlines() if line]
    return [row for row in every if row["client_request_id"] == client_request_id]


def eventually(probe: Callable[[], Any], what: str, timeout_s: float = 10) -> Any:
    """``probe()`` once it is truthy (polled, bounded)."""
    deadline = time.monotonic() + timeout_s
    while not (value := probe()):
        assert time.monotonic() < deadline, what
        time.sleep(0.02)
    return value


def key_outcomes(world: World) -> dict[str, float]:
    """``switchyard_idempotency_keys_total`` by outcome, from a scrape of ``/metrics``."""
    text = httpx.get(world.gateway.url + "/metrics", timeout=10).text
    found = {"claimed": 0.0, "replayed": 0.0, "mismatch": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "switchyard_idempotency_keys_total":
                found[sample.labels["outcome"]] = sample.value
    return found


def openai_client(world: World, token: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=world.gateway.base_url, api_key=token or world.acme, max_retries=0
    )


# -- one run per key --------------------------------------------------------------------------


def test_concurrent_retries_run_the_upstream_once(any_world: World) -> None:
    world, text, key = any_world, fresh(), fresh()
    client = openai_client(world)

    def call(_: int) -> Any:
        return client.chat.completions.with_raw_response.create(
            model="slow",
            messages=[{"role": "user", "content": text}],
            extra_headers={"Idempotency-Key": key, "x-request-id": key},
        )

    before = key_outcomes(world)
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(call, range(3)))
    assert calls(world.openai, text) == 1
    after = key_outcomes(world)
    assert after["claimed"] - before["claimed"] == 1
    assert after["replayed"] - before["replayed"] == 2
    bodies = {a.http_response.content for a in answers}
    assert len(bodies) == 1
    assert answers[0].parse().choices[0].message.content == "Hello from openai!"
    assert sorted(a.headers.get(REPLAYED) for a in answers if a.headers.get(REPLAYED)) == [
        "true",
        "true",
    ]
    (row,) = rows(world, key)
    assert row["status"] == 200 and row["SubAccountId"] == "acme"


def test_a_stream_replay_is_byte_identical(any_world: World) -> None:
    world, text, key = any_world, fresh(), fresh()
    body = chat(text, stream=True, stream_options={"include_usage": True})
    url, headers = world.gateway.base_url + "/chat/completions", {"Idempotency-Key": key}
    headers["authorization"] = f"Bearer {world.acme}"
    seen = []
    for _ in range(2):
        with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as answer:
            assert answer.status_code == 200
            seen.append((b"".join(answer.iter_raw()), answer.headers.get(REPLAYED)))
    (first, fresh_mark), (again, replay_mark) = seen
    assert first == again
    assert first.endswith(b"data: [DONE]\n\n") and b"Hello" in first
    assert (fresh_mark, replay_mark) == (None, "true")
    assert calls(world.openai, text) == 1


def test_a_client_that_left_gets_the_answer_on_retry(world: World) -> None:
    text, key, control = fresh(), fresh(), fresh()
    # Without a key, a client leaving cancels the request (499): the disconnect is real.
    with pytest.raises(httpx.ReadTimeout):
        post(
            world,
            "/v1/chat/completions",
            chat(control, "slow"),
            None,
            timeout=0.3,
            **{"x-request-id": control},
        )
    (cancelled,) = eventually(lambda: rows(world, control), "the control's row")
    assert cancelled["status"] == 499
    # With one, the request runs to its end; the retry gets its answer.
    with pytest.raises(httpx.ReadTimeout):
        post(
            world,
            "/v1/chat/completions",
            chat(text, "slow"),
            key,
            timeout=0.3,
            **{"x-request-id": key},
        )
    retry = post(world, "/v1/chat/completions", chat(text, "slow"), key, **{"x-request-id": key})
    assert retry.status_code == 200, retry.text
    assert retry.headers[REPLAYED] == "true"
    assert retry.json()["choices"][0]["message"]["content"] == "Hello from openai!"
    assert calls(world.openai, text) == 1
    (row,) = rows(world, key)
    assert row["status"] == 200


def test_a_failed_first_run_is_not_stored(world: World) -> None:
    text, key = fresh(), fresh()
    world.openai.failing.add("m-flaky")
    try:
        first = post(world, "/v1/chat/completions", chat(text, "flaky"), key)
    finally:
        world.openai.failing.discard("m-flaky")
    assert first.status_code == 502
    second = post(world, "/v1/chat/completions", chat(text, "flaky"), key)
    assert second.status_code == 200 and REPLAYED not in second.headers
    assert calls(world.openai, text) == 2
    third = post(world, "/v1/chat/completions", chat(text, "flaky"), key)
    assert third.headers[REPLAYED] == "true" and third.content == second.content
    assert calls(world.openai, text) == 2


def test_a_stream_that_failed_midway_is_not_stored(world: World) -> None:
    text, key = fresh(), fresh()
    for expected_calls in (1, 2):
        answer = post(world, "/v1/chat/completions", chat(text, "broken-stream", stream=True), key)
        assert answer.status_code == 200 and b'"error"' in answer.content
        assert b"[DONE]" not in answer.content and REPLAYED not in answer.headers
        assert calls(world.openai, text) == expected_calls


# -- refusals ---------------------------------------------------------------------------------


def test_a_different_body_under_the_key_is_refused_in_openai_shape(world: World) -> None:
    key, text, other = fresh(), fresh(), fresh()
    client = openai_client(world)
    client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": text}],
        extra_headers={"Idempotency-Key": key},
    )
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": other}],
            extra_headers={"Idempotency-Key": key},
        )
    error = info.value.response.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert error["type"] == "invalid_request_error"
    assert calls(world.openai, other) == 0


def test_a_different_body_under_the_key_is_refused_in_anthropic_shape(world: World) -> None:
    key, text, other = fresh(), fresh(), fresh()
    client = anthropic.Anthropic(base_url=world.gateway.url, api_key=world.acme, max_retries=0)
    message = client.messages.create(
        model="claude",
        max_tokens=50,
        messages=[{"role": "user", "content": text}],
        extra_headers={"Idempotency-Key": key},
    )
    again = client.messages.with_raw_response.create(
        model="claude",
        max_tokens=50,
        messages=[{"role": "user", "content": text}],
        extra_headers={"Idempotency-Key": key},
    )
    assert again.headers[REPLAYED] == "true" and again.parse().id == message.id
    with pytest.raises(anthropic.UnprocessableEntityError) as info:
        client.messages.create(
            model="claude",
            max_tokens=50,
            messages=[{"role": "user", "content": other}],
            extra_headers={"Idempotency-Key": key},
        )
    body = info.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "Idempotency-Key" in body["error"]["message"]
    assert (calls(world.anthropic, text), calls(world.anthropic, other)) == (1, 0)


def test_bad_keys_and_bad_credentials(world: World) -> None:
    text = fresh()
    too_long = post(world, "/v1/chat/completions", chat(text), "k" * 256)
    assert too_long.status_code == 400
    assert "255" in too_long.json()["error"]["message"]
    control = post(world, "/v1/chat/completions", chat(text), "a\tb")
    assert control.status_code == 400
    stranger = post(world, "/v1/chat/completions", chat(text), fresh(), token="sk-nobody")
    assert stranger.status_code == 401  # the application's own answer
    assert calls(world.openai, text) == 0


# -- scope and lifetime -----------------------------------------------------------------------


def test_tenants_have_their_own_keys(world: World) -> None:
    text, key = fresh(), fresh()
    for token in (world.acme, world.globex):
        answer = post(world, "/v1/chat/completions", chat(text), key, token=token)
        assert answer.status_code == 200 and REPLAYED not in answer.headers
    assert calls(world.openai, text) == 2


def test_keys_expire(tmp_path: Path) -> None:
    with world_of(tmp_path, "idempotency: {ttl_s: 1.0}") as world:
        key, text, other = fresh(), fresh(), fresh()
        assert post(world, "/v1/chat/completions", chat(text), key).status_code == 200
        assert post(world, "/v1/chat/completions", chat(other), key).status_code == 422
        answer = eventually(
            lambda: (
                (r := post(world, "/v1/chat/completions", chat(other), key)).status_code == 200
                and r
            ),
            "the key never expired",
        )
        assert REPLAYED not in answer.headers
        assert (calls(world.openai, text), calls(world.openai, other)) == (1, 1)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", lambda text: {"model": "embed", "input": [text]}),
        ("/v1/completions", lambda text: {"model": "chat", "prompt": text}),
        ("/v1/responses", lambda text: {"model": "chat", "input": text}),
    ],
)
def test_the_other_endpoints_take_keys(
    world: World, path: str, body: Callable[[str], dict[str, Any]]
) -> None:
    text, key = fresh(), fresh()
    first = post(world, path, body(text), key)
    assert first.status_code == 200, first.text
    again = post(world, path, body(text), key)
    assert again.headers[REPLAYED] == "true" and again.content == first.content
    assert calls(world.openai, text) == 1
    refused = post(world, path, body(fresh()), key)
    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "idempotency_key_reused"
