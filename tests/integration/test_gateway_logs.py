"""One JSON `request.completed` line per request, and no secret in any log line."""

from __future__ import annotations

import json

import httpx
import structlog

from core.config import LoggingConfig
from gateway.process.observe import configure_logging
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.gateway_harness import running_gateway


def test_request_completed_line_without_secrets(capsys):
    configure_logging(LoggingConfig(level="info", json=True), cache=False)
    try:
        run_two_requests_and_check(capsys)
    finally:
        structlog.reset_defaults()


def run_two_requests_and_check(capsys):
    with serve(FakeOpenAI()) as upstream:
        config = (
            f"providers:\n  oa: {{type: openai, base_url: '{upstream.url}/v1', api_key_env: K}}\n"
            "models:\n  m: {targets: [{provider: oa, model: m-cached}]}\n"
        )
        with running_gateway(config, {"K": "sk-provider-secret"}) as gateway:
            response = httpx.post(
                gateway.base_url + "/chat/completions",
                headers={"authorization": "Bearer sk-client-secret"},
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert response.status_code == 200
            httpx.post(gateway.base_url + "/chat/completions", content=b"{oops")
    out = capsys.readouterr().out
    assert "sk-provider-secret" not in out and "sk-client-secret" not in out
    lines = [json.loads(line) for line in out.splitlines() if '"request.completed"' in line]
    assert len(lines) == 2
    ok, bad = lines
    assert ok["request_id"] == response.headers["x-request-id"]
    assert (ok["model"], ok["provider"], ok["upstream_model"], ok["status"]) == (
        "m",
        "oa",
        "m-cached",
        200,
    )
    assert (ok["prompt_tokens"], ok["completion_tokens"], ok["cached_tokens"]) == (11, 5, 7)
    assert ok["attempts"] == 1 and ok["latency_ms"] > 0 and ok["ttft_ms"] > 0
    assert (bad["status"], bad["error"]) == (400, "invalid_json")
