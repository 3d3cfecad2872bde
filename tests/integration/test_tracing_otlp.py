"""Traces of real requests over OTLP/HTTP: a real gateway (sample ratio 0, errors always
kept) in front of a fake OpenAI upstream, the official ``openai`` SDK as the client, and
a real OTLP/HTTP receiver that decodes what the exporter sends.

Clients that want a trace send a sampled ``traceparent`` (the ratio alone keeps nothing):
a fallback (root, phases, two attempt spans whose ids the upstream saw in its
``traceparent``), a stream (first-token span), a response-cache hit (no attempt span), a
quota 429 without a ``traceparent`` (kept because it failed) and a plain success without
one (not exported). Content (prompts, completions) reaches neither spans nor logs unless
``capture_content`` is on, and then only redacted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
import structlog

from core.config import LoggingConfig
from gateway.process.observe import configure_logging
from gateway.process.redact import REDACTED
from policies.auth import KeysFile
from tests.fixtures.fake_openai import TEXT_PIECES, FakeOpenAI
from tests.fixtures.otlp_receiver import ReceivedSpan, Receiver, otlp_receiver
from tests.fixtures.server import serve
from tests.integration.gateway_harness import Gateway, running_gateway

ANSWER = "".join(TEXT_PIECES)


@dataclass
class World:
    gateway: Gateway
    upstream: FakeOpenAI
    receiver: Receiver
    acme: str  # an API key of a tenant without limits
    tiny: str  # an API key of a tenant allowed one request a minute

    def client(self, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.gateway.base_url, api_key=key or self.acme, max_retries=0
        )

    def flush(self) -> None:
        self.gateway.app.state.telemetry.tracing.flush()


def config(upstream: str, receiver: str, folder: str, tracing: str) -> str:
    return f"""
auth: {{keys_file: {folder}/keys.json}}
tenants:
  acme: {{}}
  tiny: {{limits: {{rpm: 1}}}}
routing: {{max_attempts_per_target: 1}}
response_cache: {{enabled: true}}
observability:
  tracing: {{endpoint: "{receiver}", service_name: sy-test, {tracing}}}
providers:
  oa: {{type: openai, base_url: "{upstream}/v1", api_key_env: T_OA}}
models:
  chat: {{targets: [{{provider: oa, model: m-ok}}]}}
  after-5xx: {{targets: [{{provider: oa, model: m-server-error}}, {{provider: oa, model: m-ok}}]}}
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    yield from make_world(tmp_path_factory, "sample_ratio: 0, always_on_errors: true")


@pytest.fixture(scope="module")
def capturing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    yield from make_world(tmp_path_factory, "capture_content: true")


def make_world(factory: pytest.TempPathFactory, tracing: str) -> Iterator[World]:
    folder = factory.mktemp("tracing")
    keys = KeysFile(folder / "keys.json")
    acme, _ = keys.create("acme", "ci")
    tiny, _ = keys.create("tiny", "ci")
    upstream = FakeOpenAI()
    with otlp_receiver() as receiver, serve(upstream) as up:
        text = config(up.url, receiver.url, str(folder), tracing)
        with running_gateway(text, {"T_OA": "sk-upstream-key-0123456789"}) as gateway:
            yield World(gateway, upstream, receiver, acme, tiny)


def traceparent() -> tuple[str, str, str]:
    """A fresh sampled client ``traceparent``: (header, trace id, client span id)."""
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    (span,) = [s for s in spans if s.name == name]
    return span


def root_of(spans: list[ReceivedSpan]) -> ReceivedSpan:
    (root,) = [s for s in spans if s.kind == "SERVER"]
    return root


def test_a_fallback_is_one_tree_whose_ids_the_upstream_saw(world: World) -> None:
    header, trace_id, client_span = traceparent()
    before = len(world.upstream.requests)
    raw = world.client().chat.completions.with_raw_response.create(
        model="after-5xx",
        messages=[{"role": "user", "content": "hello"}],
        extra_headers={"traceparent": header},
    )
    assert raw.http_response.status_code == 200
    world.flush()
    spans = world.receiver.trace(trace_id, 6)
    root = root_of(spans)
    assert root.name == "chat after-5xx" and root.parent_span_id == client_span
    assert root.resource["service.name"] == "sy-test"
    assert root.attributes["gen_ai.operation.name"] == "chat"
    assert root.attributes["gen_ai.request.model"] == "after-5xx"
    assert root.attributes["gen_ai.response.model"] == "m-ok"
    assert root.attributes["gen_ai.provider.name"] == "oa"
    assert root.attributes["gen_ai.usage.input_tokens"] == 11
    assert root.attributes["gen_ai.usage.output_tokens"] == 5
    assert root.attributes["http.response.status_code"] == 200
    assert list(root.attributes["gen_ai.response.finish_reasons"]) == ["stop"]
    assert root.attributes["switchyard.tenant"] == "acme"
    assert root.attributes["switchyard.request_id"] == raw.headers["x-switchyard-request-id"]
    assert "fallback after oa/m-server-error failed" in root.attributes["switchyard.route_reason"]
    assert root.status == "UNSET"
    names = {s.name for s in spans}
    assert {"authenticate", "quota.admit", "ledger.commit"} <= names
    for span in spans:
        if span is not root:
            assert span.parent_span_id == root.span_id
            assert root.start_ns <= span.start_ns <= span.end_ns <= root.end_ns
    failed, served = one(spans, "chat m-server-error"), one(spans, "chat m-ok")
    assert (failed.kind, served.kind) == ("CLIENT", "CLIENT")
    assert failed.attributes["switchyard.attempt.outcome"] == "error"
    assert failed.attributes["error.type"] == "UpstreamServerError" and failed.status == "ERROR"
    assert served.attributes["switchyard.attempt.outcome"] == "ok"
    assert served.attributes["switchyard.attempt.kind"] == "fallback"
    assert failed.end_ns <= served.start_ns
    # the upstream got a traceparent naming each attempt's exported span, in the same trace
    seen = {r.json["model"]: r.headers["traceparent"] for r in world.upstream.requests[before:]}
    for model, span in (("m-server-error", failed), ("m-ok", served)):
        version, trace, parent, flags = seen[model].split("-")
        assert (version, trace, parent, flags) == ("00", trace_id, span.span_id, "01")


def test_a_stream_has_a_first_token_span(world: World) -> None:
    header, trace_id, _ = traceparent()
    stream = world.client().chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "stream please"}],
        stream=True,
        extra_headers={"traceparent": header},
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == ANSWER
    world.flush()
    spans = world.receiver.trace(trace_id, 5)
    root, first = root_of(spans), one(spans, "first_token")
    assert first.parent_span_id == root.span_id and first.start_ns == root.start_ns
    assert first.end_ns < root.end_ns
    ttft = root.attributes["gen_ai.response.time_to_first_chunk"]
    assert ttft > 0 and abs((first.end_ns - first.start_ns) / 1e9 - ttft) < 1e-3
    assert root.attributes["gen_ai.request.stream"] is True
    assert list(root.attributes["gen_ai.response.finish_reasons"]) == ["stop"]
    attempt = one(spans, "chat m-ok")
    assert attempt.attributes["switchyard.attempt.outcome"] == "ok"


def test_a_response_cache_hit_has_no_attempt_span(world: World) -> None:
    body = {"model": "chat", "messages": [{"role": "user", "content": "cache me"}]}
    world.client().chat.completions.create(**body, temperature=0)  # fills the cache
    header, trace_id, _ = traceparent()
    raw = world.client().chat.completions.with_raw_response.create(
        **body, temperature=0, extra_headers={"traceparent": header}
    )
    assert raw.headers.get("x-switchyard-cache") == "hit"
    world.flush()
    spans = world.receiver.trace(trace_id, 3)
    root = root_of(spans)
    assert root.attributes["switchyard.cache_hit"] is True
    assert root.attributes["http.response.status_code"] == 200
    assert not [s for s in spans if s.kind == "CLIENT"]


def test_a_quota_429_is_kept_and_a_plain_success_is_not(world: World) -> None:
    client = world.client(world.tiny)
    ok = client.chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": "one"}]
    )
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "two"}])
    refused_id = info.value.response.headers["x-switchyard-request-id"]
    world.flush()
    spans = world.receiver.wait_for(
        lambda got: any(s.attributes.get("switchyard.request_id") == refused_id for s in got)
    )
    (root,) = [s for s in spans if s.attributes.get("switchyard.request_id") == refused_id]
    assert root.status == "ERROR" and root.parent_span_id == ""
    assert root.attributes["http.response.status_code"] == 429
    assert root.attributes["error.type"] == "rate_limit_exceeded"
    assert one(world.receiver.received(root.trace_id), "quota.admit")
    # the success before it was sampled out (ratio 0): nothing of it was exported
    ok_id = ok.headers["x-switchyard-request-id"]
    assert not [s for s in spans if s.attributes.get("switchyard.request_id") == ok_id]


PROMPT = "Forward the plan for pineapple-7 to jane.roe@example.com today"


def test_content_reaches_neither_spans_nor_logs_by_default(world: World, capsys) -> None:
    configure_logging(LoggingConfig(level="debug", json=True), cache=False)
    header, trace_id, _ = traceparent()
    try:
        answer = world.client().chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": PROMPT}],
            extra_headers={"traceparent": header},
        )
        httpx.post(  # an error path too: an unknown model echoes nothing of the prompt
            world.gateway.base_url + "/chat/completions",
            headers={"authorization": f"Bearer {world.acme}"},
            json={"model": "nope", "messages": [{"role": "user", "content": PROMPT}]},
        )
    finally:
        structlog.reset_defaults()
    assert answer.choices[0].message.content == ANSWER
    world.flush()
    spans = world.receiver.trace(trace_id, 4)
    captured = capsys.readouterr()
    logs = captured.out + captured.err
    assert '"request.completed"' in logs
    exported = json.dumps([s.attributes for s in spans])
    for text in ("pineapple-7", "jane.roe", ANSWER):
        assert text not in exported and text not in logs
    assert "gen_ai.input.messages" not in exported


def test_captured_content_is_redacted(capturing: World) -> None:
    header, trace_id, _ = traceparent()
    capturing.client().chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": PROMPT}],
        extra_headers={"traceparent": header},
    )
    capturing.flush()
    root = root_of(capturing.receiver.trace(trace_id, 4))
    prompt = json.loads(root.attributes["gen_ai.input.messages"])
    assert prompt == [
        {
            "role": "user",
            "parts": [
                {"type": "text", "content": f"Forward the plan for pineapple-7 to {REDACTED} today"}
            ],
        }
    ]
    output = json.loads(root.attributes["gen_ai.output.messages"])
    assert output[0]["parts"][0]["content"] == ANSWER
