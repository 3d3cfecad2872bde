"""Batch items run as their key is now in the control plane: its metadata reaches the
items' usage rows as ``tags`` and its own limits hold them (the job store keeps only the
caller's tenant and key id). Over real HTTP with the official ``openai`` SDK."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway
from tests.integration.test_batches_http import request_line, run_batch, wait_until

ADMIN = "sy-admin-control-batches-0123456789"


@dataclass
class World:
    gateway: Gateway


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("control-batches")
    with serve(FakeOpenAI()) as up:
        config = f"""
auth: {{admin_key_env: T_ADMIN}}
control: {{backend: sqlite, path: {folder / "control.sqlite3"}}}
tenants: {{acme: {{key_limits: {{rpm: 1000}}}}}}
batch: {{poll_interval_s: 0.1, max_retry_delay_s: 1}}
providers: {{oa: {{type: openai, base_url: "{up.url}/v1", api_key_env: T_OA}}}}
models: {{chat: {{targets: [{{provider: oa, model: m-ok}}]}}}}
"""
        with running_gateway(config, {"T_ADMIN": ADMIN, "T_OA": "sk-up"}) as gateway:
            yield World(gateway)


def admin(world: World, method: str, path: str, body: Any = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {ADMIN}"}
    return httpx.request(method, world.gateway.url + path, json=body, headers=headers)


def test_batch_items_carry_their_keys_tags_and_limits(world: World) -> None:
    created = admin(
        world,
        "POST",
        "/admin/keys",
        {"tenant": "acme", "metadata": {"team": "search"}, "limits": {"rpm": 2}},
    )
    assert created.status_code == 201, created.text
    client = openai.OpenAI(
        base_url=world.gateway.base_url, api_key=created.json()["key"], max_retries=0
    )
    lines = [request_line(f"t{i}", f"tagged {i}") for i in range(3)]
    batch = run_batch(client, lines)
    # The key's own rpm (2) holds the third item back until the next minute; the first
    # two are answered meanwhile.
    found = wait_until(client, batch.id, {"completed", "in_progress"})
    while found.request_counts.completed < 2:
        found = wait_until(client, batch.id, {"completed", "in_progress"})
    assert found.request_counts.completed == 2 and found.status == "in_progress"
    rows = admin(world, "GET", "/admin/usage?tenant=acme")
    assert rows.status_code == 200, rows.text
    tagged = [json.loads(line) for line in rows.text.splitlines() if line]
    assert len(tagged) == 2
    assert all(json.loads(r["Tags"]) == {"team": "search"} for r in tagged), tagged
