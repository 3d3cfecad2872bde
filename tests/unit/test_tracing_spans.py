"""Spans built from a hand-made ``RequestRecord``: the tree, the ids the upstream saw, the
times, the attributes, the tail sampling rule and content capture (off by default,
redacted when on). Spans go to an in-memory exporter through the real batch processor."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from core.config_observability import TracingConfig
from core.errors import RateLimitError, UpstreamServerError
from core.protocols import Timeouts
from core.tenancy import Principal
from core.wire import (
    AssistantMessage,
    ChatChunk,
    ChatResponse,
    Choice,
    ChunkChoice,
    Delta,
    make_usage,
)
from gateway.process.redact import REDACTED, Redactor
from gateway.telemetry.record import CAPTURE_MAX_CHARS, Phase, RequestRecord
from gateway.telemetry.trace_ids import TraceIds
from gateway.telemetry.tracing import Tracing
from routers.targets import Target
from routers.trace import Attempt

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
ROOT, CLIENT = "1111111111111111", "00f067aa0ba902b7"
CALL_A, CALL_A2, CALL_B = "aaaaaaaaaaaaaaaa", "abababababababab", "bbbbbbbbbbbbbbbb"
T0, WALL = 1000.0, 1_700_000_000.0


def target(provider: str, model: str) -> Target:
    return Target(
        alias="chat", provider_name=provider, model=model, provider=None, timeouts=Timeouts()
    )  # type: ignore[arg-type]


def record(endpoint: str = "chat", sampled: bool = True, parent: str | None = CLIENT) -> Any:
    fake_request = SimpleNamespace(headers={}, scope={})
    rec = RequestRecord(fake_request, endpoint)  # type: ignore[arg-type]
    rec.started, rec.wall_started, rec.ended = T0, WALL, T0 + 2.0
    rec.trace_ids = TraceIds(TRACE, ROOT, parent, sampled)
    rec.model = "chat"
    rec.principal = Principal(tenant="acme", key_id="0123456789ab")
    return rec


def fallback_record() -> Any:
    rec = record()
    rec.phases = [Phase("authenticate", T0, T0 + 0.01), Phase("quota.admit", T0 + 0.01, T0 + 0.02)]
    rec.call_spans = [("oa/m-bad", CALL_A), ("oa/m-ok", CALL_B)]
    rec.trace.attempts = [
        Attempt("oa/m-bad", "UpstreamServerError", T0 + 0.1, T0 + 0.3),
        Attempt("oa/m-ok", None, T0 + 0.4, T0 + 1.5),
    ]
    rec.trace.reasons = {"oa/m-ok": "priority 2"}
    rec.trace.served_by = target("oa", "m-ok")
    rec.usage = make_usage(11, 5, cached=7)
    rec.cost_usd = 0.25
    rec.phases.append(Phase("ledger.commit", T0 + 1.6, T0 + 1.7))
    return rec


def exported(tracing: Tracing, rec: Any, status: int = 200, error=None) -> list[ReadableSpan]:
    tracing.export(rec, status, error)
    tracing.flush()
    return list(tracing.exporter.get_finished_spans())  # type: ignore[attr-defined]


def make_tracing(**config: Any) -> Tracing:
    exporter = InMemorySpanExporter()
    settings = TracingConfig(endpoint="http://127.0.0.1:1/v1/traces", **config)
    tracing = Tracing(settings, Redactor(), exporter=exporter)
    tracing.exporter = exporter  # type: ignore[attr-defined]
    return tracing


@pytest.fixture
def tracing():
    tracing = make_tracing()
    yield tracing
    tracing.shutdown()


def by_name(spans: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in spans}


def ns(t: float) -> int:
    return int((WALL + (t - T0)) * 1e9)


def test_fallback_tree_ids_and_times(tracing):
    spans = exported(tracing, fallback_record())
    named = by_name(spans)
    assert set(named) == {
        "chat chat",
        "authenticate",
        "quota.admit",
        "ledger.commit",
        "chat m-bad",
        "chat m-ok",
    }
    root = named["chat chat"]
    assert root.kind is SpanKind.SERVER
    assert (root.context.trace_id, root.context.span_id) == (int(TRACE, 16), int(ROOT, 16))
    assert root.parent is not None and root.parent.span_id == int(CLIENT, 16)
    assert (root.start_time, root.end_time) == (ns(T0), ns(T0 + 2.0))
    for span in spans:
        assert span.context.trace_id == int(TRACE, 16) and span.context.trace_flags.sampled
        if span is not root:
            assert span.parent is not None and span.parent.span_id == int(ROOT, 16)
    bad, ok = named["chat m-bad"], named["chat m-ok"]
    # the attempt spans carry the ids the upstream saw in its traceparent
    assert (bad.context.span_id, ok.context.span_id) == (int(CALL_A, 16), int(CALL_B, 16))
    assert bad.kind is ok.kind is SpanKind.CLIENT
    assert (bad.start_time, bad.end_time) == (ns(T0 + 0.1), ns(T0 + 0.3))
    assert (ok.start_time, ok.end_time) == (ns(T0 + 0.4), ns(T0 + 1.5))
    assert named["ledger.commit"].start_time == ns(T0 + 1.6)


def test_fallback_attributes(tracing):
    named = by_name(exported(tracing, fallback_record()))
    root = named["chat chat"].attributes
    assert root["gen_ai.operation.name"] == "chat"
    assert (root["gen_ai.request.model"], root["gen_ai.response.model"]) == ("chat", "m-ok")
    assert root["gen_ai.provider.name"] == "oa"
    assert (root["gen_ai.usage.input_tokens"], root["gen_ai.usage.output_tokens"]) == (11, 5)
    assert root["gen_ai.usage.cache_read.input_tokens"] == 7
    assert root["http.response.status_code"] == 200
    assert (root["switchyard.tenant"], root["switchyard.cost_usd"]) == ("acme", 0.25)
    assert root["switchyard.cache_hit"] is False and root["switchyard.request_id"].startswith(
        "req_"
    )
    assert "fallback after oa/m-bad failed" in root["switchyard.route_reason"]
    assert "error.type" not in root and named["chat chat"].status.status_code is StatusCode.UNSET
    bad, ok = named["chat m-bad"], named["chat m-ok"]
    assert bad.attributes["switchyard.attempt.kind"] == "first"
    assert bad.attributes["switchyard.attempt.outcome"] == "error"
    assert bad.attributes["error.type"] == "UpstreamServerError"
    assert bad.status.status_code is StatusCode.ERROR
    assert ok.attributes["switchyard.attempt.kind"] == "fallback"
    assert ok.attributes["switchyard.attempt.reason"] == (
        "fallback after oa/m-bad failed (UpstreamServerError)"
    )
    assert ok.attributes["switchyard.attempt.outcome"] == "ok"
    assert ok.attributes["switchyard.route.reason"] == "priority 2"
    assert (ok.attributes["gen_ai.provider.name"], ok.attributes["switchyard.target"]) == (
        "oa",
        "oa/m-ok",
    )


def test_retry_and_a_cancelled_hedge_loser(tracing):
    rec = record(parent=None)
    first, second = target("oa", "slow"), target("vl", "fast")
    rec.call_spans = [("oa/slow", CALL_A), ("vl/fast", CALL_B), ("vl/fast", CALL_A2)]
    rec.trace.attempts = [
        Attempt("vl/fast", "UpstreamTimeoutError", T0 + 0.5, T0 + 0.6),
        Attempt("vl/fast", None, T0 + 0.7, T0 + 0.9),
    ]
    rec.trace.hedge, rec.trace.served_by = (first, second), second
    named = {span.context.span_id: span for span in exported(tracing, rec)}
    root = named[int(ROOT, 16)]
    assert root.parent is None and root.attributes["switchyard.hedged"] is True
    loser, hedge, retry = named[int(CALL_A, 16)], named[int(CALL_B, 16)], named[int(CALL_A2, 16)]
    assert loser.attributes["switchyard.attempt.outcome"] == "cancelled"
    assert loser.status.status_code is StatusCode.UNSET
    assert loser.end_time == ns(T0 + 2.0)  # it ends with the request
    assert hedge.attributes["switchyard.attempt.kind"] == "hedge"
    assert hedge.attributes["switchyard.attempt.outcome"] == "error"
    assert retry.attributes["switchyard.attempt.kind"] == "retry"
    assert retry.attributes["switchyard.attempt.reason"] == "retry after UpstreamTimeoutError"


def test_a_stream_has_a_first_token_span(tracing):
    rec = fallback_record()
    rec.stream, rec.ttft_s = True, 0.75
    named = by_name(exported(tracing, rec))
    first = named["first_token"]
    assert (first.start_time, first.end_time) == (ns(T0), ns(T0 + 0.75))
    assert named["chat chat"].attributes["gen_ai.response.time_to_first_chunk"] == 0.75
    assert named["chat chat"].attributes["gen_ai.request.stream"] is True


def test_non_streams_have_no_first_token_span(tracing):
    rec = fallback_record()
    rec.ttft_s = 0.75
    assert "first_token" not in by_name(exported(tracing, rec))


@pytest.mark.parametrize(
    ("endpoint", "operation"),
    [("messages", "chat"), ("completions", "text_completion"), ("embeddings", "embeddings")],
)
def test_operation_names_follow_the_endpoint(tracing, endpoint, operation):
    rec = record(endpoint)
    root = exported(tracing, rec)[0]
    assert root.name == f"{operation} chat"
    assert root.attributes["gen_ai.operation.name"] == operation


def test_a_failed_request_is_an_error_span(tracing):
    rec = record()
    error = UpstreamServerError("every target failed")
    root = exported(tracing, rec, 502, error)[0]
    assert root.status.status_code is StatusCode.ERROR
    assert root.attributes["error.type"] == "upstream_error"
    assert root.attributes["http.response.status_code"] == 502
    assert "switchyard.route_reason" not in root.attributes  # nothing served


def test_a_client_that_left_has_its_status_as_the_error_type(tracing):
    root = exported(tracing, record(), 499)[0]
    assert root.attributes["error.type"] == "499"


@pytest.mark.parametrize(
    ("sampled", "status", "failed_attempt", "always_on_errors", "kept"),
    [
        (True, 200, False, True, True),
        (True, 404, False, False, True),
        (False, 200, False, True, False),
        (False, 500, False, True, True),
        (False, 502, False, True, True),
        (False, 429, False, True, True),
        (False, 200, True, True, True),  # served after a fallback
        (False, 400, False, True, False),
        (False, 404, False, True, False),
        (False, 499, False, True, False),
        (False, 500, False, False, False),
    ],
)
def test_tail_sampling(sampled, status, failed_attempt, always_on_errors, kept):
    tracing = make_tracing(always_on_errors=always_on_errors)
    rec = record(sampled=sampled)
    if failed_attempt:
        rec.trace.attempts = [Attempt("oa/x", "UpstreamServerError", T0, T0 + 0.1)]
    error = RateLimitError("slow down") if status == 429 else None
    try:
        assert tracing.keeps(rec, status) is kept
        assert bool(exported(tracing, rec, status, error)) is kept
    finally:
        tracing.shutdown()


def test_no_trace_ids_means_no_spans(tracing):
    rec = record()
    rec.trace_ids = None
    assert exported(tracing, rec) == []


def test_export_never_raises(tracing, capsys):
    rec = record()
    rec.trace_ids = TraceIds("not hex", ROOT, None, True)
    tracing.export(rec, 200, None)  # logged, not raised
    assert "tracing.export_failed" in capsys.readouterr().out


PROMPT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Mail jane.doe@example.com the key sk-proj-AbCdEfGhIjKlMnOpQrSt"},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "and this picture"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
    },
    {
        "role": "assistant",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


def content_record() -> Any:
    rec = fallback_record()
    rec.content_in = json.dumps(PROMPT)
    rec.content_out = "Done, wrote to jane.doe@example.com"
    return rec


def test_content_is_not_exported_by_default(tracing):
    for span in exported(tracing, content_record()):
        text = json.dumps(dict(span.attributes))
        assert "gen_ai.input.messages" not in text and "jane.doe" not in text
        assert "Be brief" not in text and "Done, wrote" not in text


def test_captured_content_is_redacted_and_shaped_as_semconv_messages():
    tracing = make_tracing(capture_content=True)
    try:
        root = exported(tracing, content_record())[0]
    finally:
        tracing.shutdown()
    prompt = json.loads(root.attributes["gen_ai.input.messages"])
    answer = json.loads(root.attributes["gen_ai.output.messages"])
    assert prompt[0] == {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]}
    assert prompt[1]["parts"][0]["content"] == f"Mail {REDACTED} the key {REDACTED}"
    assert prompt[2]["parts"] == [
        {"type": "text", "content": "and this picture"},
        {"type": "image_url"},
    ]
    assert prompt[3]["parts"] == [
        {"type": "tool_call", "id": "call_1", "name": "f", "arguments": "{}"}
    ]
    assert prompt[4] == {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": "call_1", "response": "sunny"}],
    }
    assert answer == [
        {"role": "assistant", "parts": [{"type": "text", "content": f"Done, wrote to {REDACTED}"}]}
    ]
    assert "base64,AAAA" not in root.attributes["gen_ai.input.messages"]


def test_captured_content_is_cut_and_plain_text_is_one_user_message():
    tracing = make_tracing(capture_content=True)
    rec = record()
    rec.content_in = "not json " * CAPTURE_MAX_CHARS
    try:
        root = exported(tracing, rec)[0]
    finally:
        tracing.shutdown()
    (message,) = json.loads(root.attributes["gen_ai.input.messages"])
    assert message["role"] == "user"
    text = message["parts"][0]["content"]
    assert text.endswith("[truncated]") and len(text) < CAPTURE_MAX_CHARS + 20
    assert "gen_ai.output.messages" not in root.attributes


def test_the_record_keeps_streamed_and_whole_answers_up_to_the_cap():
    rec = record()

    def chunk(text: str) -> ChatChunk:
        return ChatChunk("c", 1, "m", [ChunkChoice(0, Delta(content=text))])

    rec.capture_answer(chunk("Hello"))
    rec.capture_answer(chunk(" world"))
    rec.capture_answer(ChatChunk("c", 1, "m", [ChunkChoice(0, Delta(), "stop")]))
    assert rec.content_out == "Hello world"
    whole = ChatResponse("r", 1, "m", [Choice(0, AssistantMessage(content="x" * 10), "stop")])
    for _ in range(CAPTURE_MAX_CHARS // 5):
        rec.capture_answer(whole)
    assert len(rec.content_out) == CAPTURE_MAX_CHARS
