"""The exact-repeat response cache over real HTTP, driven by the openai SDK and httpx: an
in-process gateway with two tenants (API keys) in front of a fake OpenAI upstream.

A deterministic request answered once is answered again from the cache (the upstream is
not called), also as a stream when the repeat asks for one; entries are per tenant;
non-deterministic requests are never cached; ``Cache-Control: no-store`` neither reads nor
writes and ``no-cache`` does not read. Ledger rows of hits say so and cost nothing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from policies.auth import KeysFile
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-cache-0123456789abcdef"
UPSTREAM_MODEL = "m-cache"
CACHE = "x-switchyard-cache"


@dataclass
class World:
    gateway: Gateway
    upstream: FakeOpenAI
    acme: str
    globex: str


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("response-cache")
    keys = KeysFile(folder / "keys.json")
    acme, _ = keys.create("acme", "ci")
    globex, _ = keys.create("globex", "ci")
    upstream = FakeOpenAI()
    with serve(upstream) as up:
        config = f"""
auth: {{admin_key_env: T_ADMIN, keys_file: {folder / "keys.json"}}}
tenants: {{acme: {{}}, globex: {{}}}}
ledger: {{path: {folder / "usage.sqlite3"}}}
response_cache: {{enabled: true}}
providers:
  oa: {{type: openai, base_url: "{up.url}/v1", api_key_env: T_OA}}
models:
  chat:
    targets:
      - provider: oa
        model: {UPSTREAM_MODEL}
        price: {{input_per_mtok: 1000, output_per_mtok: 1000}}
"""
        with running_gateway(config, {"T_ADMIN": ADMIN, "T_OA": "sk-upstream"}) as gateway:
            yield World(gateway, upstream, acme, globex)


def calls(world: World) -> int:
    return sum(1 for r in world.upstream.requests if (r.json or {}).get("model") == UPSTREAM_MODEL)


def question() -> str:
    """A prompt no other test sends, so each test starts with an empty cache for it."""
    return f"What is in the cache? {uuid.uuid4().hex}"


def post(
    world: World, key: str, text: str, headers: dict[str, str] | None = None, **fields: Any
) -> httpx.Response:
    body = {"model": "chat", "messages": [{"role": "user", "content": text}], **fields}
    answer = httpx.post(
        world.gateway.base_url + "/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}", **(headers or {})},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return answer


def usage_rows(world: World) -> dict[str, dict[str, Any]]:
    answer = httpx.get(
        world.gateway.url + "/admin/usage", headers={"authorization": f"Bearer {ADMIN}"}
    )
    assert answer.status_code == 200, answer.text
    rows = [json.loads(line) for line in answer.text.splitlines() if line]
    return {row["client_request_id"]: row for row in rows}


def test_repeat_is_a_hit_also_replayed_as_a_stream(world: World) -> None:
    text = question()
    before = calls(world)
    first = post(world, world.acme, text, temperature=0)
    assert first.headers[CACHE] == "miss"
    assert calls(world) == before + 1

    again = post(world, world.acme, text, temperature=0)
    assert again.headers[CACHE] == "hit"
    assert calls(world) == before + 1  # not called again
    # The gateway's own encoding of the same answer (fields it does not model are not kept).
    hit, fresh = again.json()["choices"][0], first.json()["choices"][0]
    assert hit["message"]["content"] == fresh["message"]["content"] == "Hello from openai!"
    assert (hit["message"]["role"], hit["finish_reason"]) == ("assistant", "stop")
    assert again.json()["usage"] == first.json()["usage"]

    client = openai.OpenAI(base_url=world.gateway.base_url, api_key=world.acme, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="chat",
        messages=[{"role": "user", "content": text}],
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert raw.headers[CACHE] == "hit"
    assert raw.headers["content-type"].startswith("text/event-stream")
    chunks = list(raw.parse())
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == first.json()["choices"][0]["message"]["content"] == "Hello from openai!"
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == first.json()["usage"]["total_tokens"]
    assert calls(world) == before + 1


def test_the_same_body_from_another_tenant_is_a_miss(world: World) -> None:
    text = question()
    before = calls(world)
    assert post(world, world.acme, text, temperature=0).headers[CACHE] == "miss"
    assert post(world, world.acme, text, temperature=0).headers[CACHE] == "hit"
    other = post(world, world.globex, text, temperature=0)
    assert other.headers[CACHE] == "miss"
    assert calls(world) == before + 2
    assert post(world, world.globex, text, temperature=0).headers[CACHE] == "hit"
    assert calls(world) == before + 2


def test_sampled_requests_are_cached_only_with_a_seed(world: World) -> None:
    text = question()
    before = calls(world)
    for _ in range(2):
        answer = post(world, world.acme, text, temperature=0.7)
        assert CACHE not in answer.headers  # not even looked up
    assert calls(world) == before + 2
    assert post(world, world.acme, text, temperature=0.7, seed=7).headers[CACHE] == "miss"
    assert post(world, world.acme, text, temperature=0.7, seed=7).headers[CACHE] == "hit"
    assert calls(world) == before + 3


def test_no_store_neither_reads_nor_writes(world: World) -> None:
    text = question()
    before = calls(world)
    no_store = {"cache-control": "no-store"}
    assert CACHE not in post(world, world.acme, text, no_store, temperature=0).headers
    assert calls(world) == before + 1
    # Nothing was written: a plain repeat misses and is stored.
    assert post(world, world.acme, text, temperature=0).headers[CACHE] == "miss"
    assert calls(world) == before + 2
    # An entry exists now, but no-store does not read it either.
    assert CACHE not in post(world, world.acme, text, no_store, temperature=0).headers
    assert calls(world) == before + 3
    assert post(world, world.acme, text, temperature=0).headers[CACHE] == "hit"
    assert calls(world) == before + 3


def test_no_cache_does_not_read(world: World) -> None:
    text = question()
    before = calls(world)
    assert post(world, world.acme, text, temperature=0).headers[CACHE] == "miss"
    fresh = post(world, world.acme, text, {"cache-control": "no-cache"}, temperature=0)
    assert fresh.headers.get(CACHE) != "hit"
    assert calls(world) == before + 2
    assert post(world, world.acme, text, temperature=0).headers[CACHE] == "hit"
    assert calls(world) == before + 2


def test_ledger_rows_of_hits_cost_nothing(world: World) -> None:
    text = question()
    ids = {name: f"req-cache-{name}-{uuid.uuid4().hex[:12]}" for name in ("miss", "hit", "sse")}
    post(world, world.acme, text, {"x-request-id": ids["miss"]}, temperature=0)
    post(world, world.acme, text, {"x-request-id": ids["hit"]}, temperature=0)
    streamed = post(
        world, world.acme, text, {"x-request-id": ids["sse"]}, temperature=0, stream=True
    )
    assert streamed.headers[CACHE] == "hit"
    assert streamed.text.rstrip().endswith("data: [DONE]")
    rows = usage_rows(world)
    miss, hit, sse = (rows[ids[name]] for name in ("miss", "hit", "sse"))
    assert miss["cache_hit"] is False and miss["BilledCost"] > 0
    assert miss["SubAccountId"] == "acme" and miss["status"] == 200
    for row in (hit, sse):
        assert row["cache_hit"] is True
        assert row["BilledCost"] == 0 and row["EffectiveCost"] == 0
        assert row["SubAccountId"] == "acme" and row["status"] == 200
        assert row["prompt_tokens"] == miss["prompt_tokens"]  # what the answer took, once
    assert sse["stream"] is True and hit["stream"] is False
