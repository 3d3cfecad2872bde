"""Hot reload over real HTTP: an invalid file is rejected with its key-path errors and the
old policy keeps serving; a valid one is swapped in (by POST /admin/reload and by the file
watcher); requests in flight finish on the snapshot they started with."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from core.config import load_config
from gateway.app import create_app
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import ServerThread, serve
from tests.integration.gateway_harness import with_private_ledger

ADMIN = "sy-admin-test-key"
ENV = {"TEST_OA_KEY": "sk-test", "TEST_ADMIN_KEY": ADMIN}


def policy(upstream: str, aliases: dict[str, str], *, watch: bool = False) -> str:
    models = "\n".join(
        f"  {alias}: {{targets: [{{provider: oa, model: {model}}}]}}"
        for alias, model in aliases.items()
    )
    return f"""
server: {{watch_config: {str(watch).lower()}, watch_interval_s: 0.05}}
auth: {{admin_key_env: TEST_ADMIN_KEY}}
providers:
  oa: {{type: openai, base_url: "{upstream}/v1", api_key_env: TEST_OA_KEY}}
models:
{models}
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAI]:
    app = FakeOpenAI()
    with serve(app) as server:
        app.url = server.url  # type: ignore[attr-defined]
        yield app


def start(path: Path) -> ServerThread:
    app = create_app(with_private_ledger(load_config(path)), env=ENV)
    return ServerThread(app).start()


def ask(url: str, model: str) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}]
    )
    return answer.choices[0].message.content or ""


def reload(url: str, key: str = ADMIN) -> httpx.Response:
    return httpx.post(url + "/admin/reload", headers={"authorization": f"Bearer {key}"})


def test_broken_file_is_rejected_and_old_policy_keeps_serving(tmp_path, upstream):
    path = tmp_path / "policy.yaml"
    path.write_text(policy(upstream.url, {"first": "m-ok"}))
    server = start(path)
    try:
        assert ask(server.url, "first") == "Hello from openai!"
        path.write_text(
            policy(upstream.url, {"first": "m-ok"})
            + "  broken: {targets: [{provider: nowhere, model: x}]}\n"
            + "routing: {max_attempts_per_target: 0}\n"
        )
        answer = reload(server.url)
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["code"] == "invalid_config"
        assert "models.broken.targets[0].provider: unknown provider 'nowhere'" in error["message"]
        assert "routing.max_attempts_per_target" in error["message"]
        assert ask(server.url, "first") == "Hello from openai!"
        models = httpx.get(server.url + "/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["first"]
    finally:
        server.stop()


def test_valid_file_is_swapped_in_by_the_admin_endpoint(tmp_path, upstream):
    path = tmp_path / "policy.yaml"
    path.write_text(policy(upstream.url, {"first": "m-ok"}))
    server = start(path)
    try:
        path.write_text(policy(upstream.url, {"second": "m-json"}))
        assert reload(server.url, key="not-the-admin-key").status_code in (401, 403)
        answer = reload(server.url)
        assert answer.status_code == 200, answer.text
        assert answer.json()["models"] == ["second"]
        assert ask(server.url, "second") == '{"answer": 42}'
        with pytest.raises(openai.NotFoundError):
            ask(server.url, "first")
    finally:
        server.stop()


def test_file_watcher_reloads_on_change(tmp_path, upstream):
    path = tmp_path / "policy.yaml"
    path.write_text(policy(upstream.url, {"first": "m-ok"}, watch=True))
    server = start(path)
    try:
        path.write_text(policy(upstream.url, {"first": "m-ok", "added": "m-json"}, watch=True))
        deadline = time.monotonic() + 20
        ids: list[str] = []
        while time.monotonic() < deadline:
            ids = [m["id"] for m in httpx.get(server.url + "/v1/models").json()["data"]]
            if "added" in ids:
                break
            time.sleep(0.05)
        assert ids == ["first", "added"]
        assert ask(server.url, "added") == '{"answer": 42}'
    finally:
        server.stop()


def test_request_in_flight_finishes_on_its_snapshot(tmp_path, upstream):
    upstream.slow_seconds = 1.0
    path = tmp_path / "policy.yaml"
    path.write_text(policy(upstream.url, {"slow": "m-slow"}))
    server = start(path)

    async def scenario() -> tuple[int, int]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            body = {"model": "slow", "messages": [{"role": "user", "content": "hi"}]}
            in_flight = asyncio.create_task(client.post("/v1/chat/completions", json=body))
            await asyncio.sleep(0.3)
            path.write_text(policy(upstream.url, {"other": "m-ok"}))
            swapped = await client.post(
                "/admin/reload", headers={"authorization": f"Bearer {ADMIN}"}
            )
            assert swapped.status_code == 200
            return (await in_flight).status_code, (
                await client.post("/v1/chat/completions", json=body)
            ).status_code

    try:
        finished, after = asyncio.run(scenario())
        assert finished == 200  # started on the old policy, served by it
        assert after == 404  # the alias is gone from the new one
    finally:
        upstream.slow_seconds = 3.0
        server.stop()
