"""Fixtures for end-to-end tests: a fake OpenAI upstream and a gateway in front of it."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import resetting_server, serve
from tests.integration.gateway_harness import Gateway, closed_port_url, running_gateway


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    app = FakeOpenAI()
    with serve(app) as server:
        app.url = server.url  # type: ignore[attr-defined]
        yield app


@pytest.fixture(scope="module")
def gateway(fake: FakeOpenAI) -> Iterator[Gateway]:
    up = fake.url  # type: ignore[attr-defined]
    with resetting_server() as reset_url:
        config = f"""
server: {{max_body_bytes: 20000}}
routing: {{max_attempts_per_target: 2, retry_backoff_s: 0.01}}
providers:
  oa: {{type: openai, base_url: "{up}/v1", api_key_env: TEST_OA_KEY}}
  impatient: {{type: openai, base_url: "{up}/v1", api_key_env: TEST_OA_KEY, timeout_s: 0.5, first_token_timeout_s: 0.5}}
  dead: {{type: openai, base_url: "{closed_port_url()}", connect_timeout_s: 1}}
  reset: {{type: openai, base_url: "{reset_url}/v1"}}
  nokey: {{type: openai, api_key_env: SWITCHYARD_TEST_UNSET_KEY}}
models:
  gpt-4o-mini: {{targets: [{{provider: oa, model: m-ok}}]}}
  tools: {{targets: [{{provider: oa, model: m-tool}}]}}
  json: {{targets: [{{provider: oa, model: m-json}}]}}
  cached: {{targets: [{{provider: oa, model: m-cached}}]}}
  embed: {{targets: [{{provider: oa, model: text-embedding-3-small}}]}}
  after-5xx: {{targets: [{{provider: oa, model: m-server-error}}, {{provider: oa, model: m-ok}}]}}
  after-429: {{targets: [{{provider: oa, model: m-rate-limited}}, {{provider: oa, model: m-ok}}]}}
  after-refused: {{targets: [{{provider: dead, model: x}}, {{provider: oa, model: m-ok}}]}}
  after-reset: {{targets: [{{provider: reset, model: x}}, {{provider: oa, model: m-ok}}]}}
  after-slow: {{targets: [{{provider: impatient, model: m-slow}}, {{provider: oa, model: m-ok}}]}}
  all-429: {{targets: [{{provider: oa, model: m-rate-limited}}, {{provider: oa, model: m-rate-limited}}]}}
  all-fail: {{targets: [{{provider: oa, model: m-server-error}}, {{provider: oa, model: m-malformed}}]}}
  bad-first: {{targets: [{{provider: oa, model: m-bad-request}}, {{provider: oa, model: m-ok}}]}}
  slow: {{targets: [{{provider: impatient, model: m-slow}}]}}
  midstream: {{targets: [{{provider: oa, model: m-stream-error}}, {{provider: oa, model: m-ok}}]}}
  truncated: {{targets: [{{provider: oa, model: m-truncated}}]}}
  slow-stream: {{targets: [{{provider: oa, model: m-slow-stream}}]}}
  keyless: {{targets: [{{provider: nokey, model: gpt-4o}}]}}
"""
        with running_gateway(config, {"TEST_OA_KEY": "sk-test-secret"}) as gw:
            yield gw


@pytest.fixture
def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="client-key", max_retries=0)


@pytest.fixture
def aclient(gateway: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.base_url, api_key="client-key", max_retries=0)
