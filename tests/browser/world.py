"""The browser tests' world: a fake OpenAI upstream, a real gateway (uvicorn on 127.0.0.1,
started from a policy file so the routing page has a file to validate) with a control
plane and a SQLite ledger, and Debian's Chromium driven by Playwright.

Screenshots go to ``$SWITCHYARD_ARTIFACTS/console`` (default ``.cache/artifacts/console``
in the repository, ignored by git): CI keeps them as the run's artifacts."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.config import load_config
from gateway.app import create_app
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import ServerThread, serve

CHROMIUM = os.environ.get("SWITCHYARD_CHROMIUM", "/usr/bin/chromium")
ADMIN = "sy-admin-browser-0123456789"
XSS_TENANT = "<img src=x onerror=alert('tenant')>"
XSS_ALIAS = "<svg onload=alert('alias')>"
XSS_MODEL = "<script>alert('model')</script>"
XSS_KEY = "\"><img src=x onerror=alert('key')>"
REPO = Path(__file__).resolve().parents[2]
CONFIG = """
auth: {{admin_key_env: T_ADMIN}}
control: {{path: {folder}/control.sqlite3, poll_interval_s: 0.2}}
tenants:
  acme: {{limits: {{rpm: 1000, usd_per_day: 50}}}}
  globex: {{}}
  "{xss_tenant}": {{}}
ledger: {{path: {folder}/usage.sqlite3}}
routing: {{breaker: {{consecutive_failures: 2, min_calls: 2, cooldown_s: 600}}}}
providers:
  oa: {{type: openai, base_url: "{upstream}/v1", api_key_env: T_OA}}
models:
  chat:
    targets: [{{provider: oa, model: m-count, price: {{input_per_mtok: 100, output_per_mtok: 200}}}}]
  flaky: {{targets: [{{provider: oa, model: m-flaky}}]}}
  "{xss_alias}": {{targets: [{{provider: oa, model: m-xss}}]}}
"""


def artifacts() -> Path:
    base = os.environ.get("SWITCHYARD_ARTIFACTS") or str(REPO / ".cache" / "artifacts")
    folder = Path(base) / "console"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@dataclass
class World:
    url: str
    upstream: FakeOpenAI
    folder: Path
    keys: dict[str, str] = field(default_factory=dict)  # tenant -> a plain API key

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def admin(self, method: str, path: str, body: Any = None) -> httpx.Response:
        headers = {"authorization": f"Bearer {ADMIN}"}
        return httpx.request(method, self.url + path, json=body, headers=headers, timeout=10)

    def new_key(self, tenant: str, **fields: Any) -> tuple[str, str]:
        answer = self.admin("POST", "/admin/keys", {"tenant": tenant, **fields})
        assert answer.status_code == 201, answer.text
        return answer.json()["key"], answer.json()["id"]


@pytest.fixture(scope="package")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("console")
    upstream = FakeOpenAI()
    with serve(upstream) as up:
        text = CONFIG.format(
            folder=folder, upstream=up.url, xss_tenant=XSS_TENANT, xss_alias=XSS_ALIAS
        )
        path = folder / "config.yaml"
        path.write_text(text)
        app = create_app(load_config(path), env={"T_ADMIN": ADMIN, "T_OA": "sk-upstream"})
        server = ServerThread(app).start()
        try:
            world = World(server.url, upstream, folder)
            for tenant in ("acme", "globex"):
                world.keys[tenant], _ = world.new_key(tenant, name=f"{tenant}-app")
            yield world
        finally:
            server.stop()


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/setup_browser.sh (Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            yield browser
        finally:
            browser.close()


def clean_artifacts() -> None:
    shutil.rmtree(artifacts(), ignore_errors=True)
