"""OpenTelemetry traces of finished requests, exported over OTLP/HTTP.

The request path records facts (``RequestRecord``); ``Tracing.export`` turns a finished
record into spans once, with the record's own times and ids, and queues them on the SDK's
``BatchSpanProcessor``, whose thread sends them (the event loop never waits on the network).

One trace per request: ``"{operation} {alias}"`` (SERVER; ``gen_ai.*``, HTTP status,
``switchyard.*``; ``error.type`` and ERROR when the status is >= 400) under the client's
span when it sent a ``traceparent``, with children: one per phase (``authenticate``,
``quota.admit``, ``queue.wait``, ``ledger.commit``); one CLIENT span per upstream call,
``"{operation} {upstream model}"``, whose id is the one its ``traceparent`` named, with
``switchyard.attempt.kind`` (first, retry, fallback, hedge) and ``.reason``, and
``.outcome``: ok (a stream: its first chunk came), error (``error.type``, ERROR) or
cancelled (never reported back, e.g. a hedge race's loser; it ends with the request);
``first_token`` for streams, from the request's start to its first byte.

Sampling is decided at the end: a trace is kept when its head decision says so (the
client's ``sampled`` flag, else ``sample_ratio`` by trace id) or, with ``always_on_errors``,
when the gateway or an upstream failed: status 5xx, 429 (quota or upstream limits), or any
failed upstream attempt (also when a fallback then served). Other 4xx and 499 (the client
left) are the client's doing, frequent under abuse: they follow the ratio.

Prompts and completions go out only with ``capture_content``: the record's ``content_in``/
``content_out``, redacted (``Redactor``) and cut at ``CAPTURE_MAX_CHARS``, as
``gen_ai.input.messages`` / ``gen_ai.output.messages`` (semantic-convention JSON).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any, NamedTuple

import structlog
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from core.config_observability import TracingConfig
from core.errors import GatewayError
from gateway import __version__
from gateway.process.redact import Redactor
from gateway.telemetry.content import Cut, input_messages, to_json
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.series import operation_of
from gateway.telemetry.trace_ids import TraceIds, new_span_id
from routers.trace import Attempt

_log = structlog.get_logger("switchyard")

EXPORT_TIMEOUT_S = 5.0  # one OTLP request (the exporter's thread waits, never the loop)
SCHEDULE_DELAY_MS = 1000  # spans reach the collector within about a second
SHUTDOWN_TIMEOUT_S = 2.0  # how long shutdown waits for the last batch
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)  # exported spans are sampled, by definition
_UNSET = Status(StatusCode.UNSET)

Attributes = dict[str, Any]


class Tracing:
    """The trace exporter of one ``observability.tracing`` section (``config``).

    ``redact``: applied to captured content (``capture_content``); ``exporter``: where spans
    go (default: OTLP/HTTP to ``config.endpoint`` with ``config.headers``; tests pass an
    in-memory one)."""

    def __init__(
        self,
        config: TracingConfig,
        redact: Redactor | None = None,
        exporter: SpanExporter | None = None,
    ) -> None:
        self.config = config
        self._redactor = redact or Redactor()
        self.resource = Resource.create({"service.name": config.service_name})
        self.scope = InstrumentationScope("switchyard", __version__)
        if exporter is None:
            exporter = OTLPSpanExporter(
                endpoint=config.endpoint, headers=dict(config.headers), timeout=EXPORT_TIMEOUT_S
            )
        self._processor = BatchSpanProcessor(exporter, schedule_delay_millis=SCHEDULE_DELAY_MS)

    def keeps(self, record: RequestRecord, status: int) -> bool:
        """The sampling decision (see the module's docstring)."""
        ids = record.trace_ids
        if ids is None:
            return False
        return ids.sampled or (self.config.always_on_errors and failed(record, status))

    def export(self, record: RequestRecord, status: int, error: GatewayError | None) -> None:
        """Queue the spans of a finished request when its trace is kept. Never raises and
        never waits on the network."""
        try:
            if not self.keeps(record, status):
                return
            for span in _Builder(self, record).build(status, error):
                self._processor.on_end(span)
        except Exception:
            _log.exception("tracing.export_failed", request_id=record.request_id)

    def flush(self, timeout_s: float = EXPORT_TIMEOUT_S) -> None:
        """Send what is queued now, waiting at most ``timeout_s``."""
        _bounded(self._processor.force_flush, timeout_s)

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Send what is queued and stop the exporter's thread, waiting at most
        ``timeout_s`` (0: not at all, e.g. on the event loop during a reload); past it
        the last batch goes on in the background."""
        _bounded(self._processor.shutdown, timeout_s)

    def content(self, record: RequestRecord) -> Attributes:
        """``gen_ai.input.messages`` / ``gen_ai.output.messages``, redacted and cut."""
        if not self.config.capture_content:
            return {}
        attributes: Attributes = {}
        if record.content_in is not None:
            messages = input_messages(record.content_in, Cut(self._redactor))
            attributes["gen_ai.input.messages"] = to_json(messages)
        if record.content_out is not None:
            text = Cut(self._redactor).text(record.content_out)
            answer = [{"role": "assistant", "parts": [{"type": "text", "content": text}]}]
            attributes["gen_ai.output.messages"] = to_json(answer)
        return attributes


def failed(record: RequestRecord, status: int) -> bool:
    """The request failed on the gateway's or an upstream's side (see the docstring)."""
    return status >= 500 or status == 429 or any(a.error for a in record.trace.attempts)


def _bounded(work: Callable[[], object], timeout_s: float) -> None:
    """Run ``work`` in a thread of its own and wait for it at most ``timeout_s``."""
    thread = threading.Thread(target=work, name="switchyard-traces", daemon=True)
    thread.start()
    if timeout_s > 0:
        thread.join(timeout_s)


class _Builder:
    """Builds one request's spans from its record."""

    def __init__(self, tracing: Tracing, record: RequestRecord) -> None:
        assert record.trace_ids is not None
        self.tracing = tracing
        self.record = record
        self.ids: TraceIds = record.trace_ids
        self.trace_id = int(self.ids.trace_id, 16)
        self.root = self._context(self.ids.span_id)
        self.operation = operation_of(record.endpoint)
        self.ended = record.ended if record.ended is not None else time.monotonic()

    def build(self, status: int, error: GatewayError | None) -> list[ReadableSpan]:
        record = self.record
        spans = [self._root(status, error)]
        root = self.root
        spans += [self._span(root, p.name, new_span_id(), p.start, p.end) for p in record.phases]
        spans += self._calls()
        if record.stream and record.ttft_s is not None:
            first = record.started + record.ttft_s
            spans.append(self._span(root, "first_token", new_span_id(), record.started, first))
        return spans

    def _root(self, status: int, error: GatewayError | None) -> ReadableSpan:
        record, client = self.record, self.ids.parent_span_id
        parent = None if client is None else SpanContext(self.trace_id, int(client, 16), True)
        name = f"{self.operation} {record.model}" if record.model else self.operation
        attributes = {**self._gen_ai(), **self._switchyard(), "http.response.status_code": status}
        attributes.update(self.tracing.content(record))
        state = None
        if status >= 400:
            failure = (error.code or type(error).__name__) if error else str(status)
            attributes["error.type"] = failure
            state = Status(StatusCode.ERROR, failure)
        span_id, start, kind = self.ids.span_id, record.started, SpanKind.SERVER
        return self._span(parent, name, span_id, start, self.ended, kind, attributes, state)

    def _gen_ai(self) -> Attributes:
        record = self.record
        attributes: Attributes = {
            "gen_ai.operation.name": self.operation,
            "gen_ai.request.stream": record.stream,
        }
        if record.model is not None:
            attributes["gen_ai.request.model"] = record.model
        served = record.trace.served_by
        if served is not None:
            attributes["gen_ai.provider.name"] = served.provider_name
            attributes["gen_ai.response.model"] = served.model
        usage = record.usage
        if usage is not None:
            attributes["gen_ai.usage.input_tokens"] = usage.prompt_tokens
            attributes["gen_ai.usage.output_tokens"] = usage.completion_tokens
            if usage.cached_tokens:
                attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cached_tokens
            if usage.reasoning_tokens:
                attributes["gen_ai.usage.reasoning.output_tokens"] = usage.reasoning_tokens
        if record.finish_reasons:
            attributes["gen_ai.response.finish_reasons"] = record.finish_reasons
        if record.stream and record.ttft_s is not None:
            attributes["gen_ai.response.time_to_first_chunk"] = record.ttft_s
        return attributes

    def _switchyard(self) -> Attributes:
        record, trace = self.record, self.record.trace
        attributes: Attributes = {
            "switchyard.request_id": record.request_id,
            "switchyard.endpoint": record.endpoint,
            "switchyard.cache_hit": record.cache_hit,
            "switchyard.cost_usd": record.cost_usd,
            "switchyard.attempts": len(trace.attempts),
            "switchyard.fallbacks": trace.fallbacks,
            "switchyard.usage_estimated": record.usage_estimated,
        }
        if record.principal.tenant is not None:
            attributes["switchyard.tenant"] = record.principal.tenant
        if record.client_request_id is not None:
            attributes["switchyard.client_request_id"] = record.client_request_id
        if trace.served_by is not None:
            attributes["switchyard.route_reason"] = trace.route_reason()
        if trace.skipped:
            attributes["switchyard.skipped"] = [f"{s.label} ({s.reason})" for s in trace.skipped]
        if trace.hedge is not None:
            attributes["switchyard.hedged"] = True
        return attributes

    def _calls(self) -> list[ReadableSpan]:
        """One CLIENT span per upstream call, in call order; a call is matched to the
        attempt of its label that came in the same place (retries of a target run one
        after the other, so the k-th call of a label is its k-th attempt)."""
        pending: dict[str, deque[Attempt]] = defaultdict(deque)
        for done in self.record.trace.attempts:
            pending[done.label].append(done)
        calls = [
            _Call(label, span_id, pending[label].popleft() if pending[label] else None)
            for label, span_id in self.record.call_spans
        ]
        # attempts with no recorded call (should not happen while tracing is on)
        calls += [_Call(a.label, new_span_id(), a) for left in pending.values() for a in left]
        spans: list[ReadableSpan] = []
        previous: _Call | None = None
        began = self._routing_began()
        for index, call in enumerate(calls):
            first_of_label = all(c.label != call.label for c in calls[:index])
            start = call.attempt.started if call.attempt is not None else began
            spans.append(self._call(call, start, self._why(call, first_of_label, previous)))
            previous, began = call, start
        return spans

    def _why(self, call: _Call, first_of_label: bool, previous: _Call | None) -> Attributes:
        """Why this call was made: ``switchyard.attempt.kind`` and ``.reason``."""
        if previous is None:
            return {"switchyard.attempt.kind": "first"}
        error = previous.attempt.error if previous.attempt is not None else None
        hedge = self.record.trace.hedge
        if hedge is not None and call.label == hedge[1].label and first_of_label:
            kind, reason = "hedge", f"hedged {hedge[0].label}"
        elif call.label == previous.label:
            kind, reason = "retry", f"retry after {error or 'an error'}"
        else:
            failure = f" failed ({error})" if error is not None else ""
            kind, reason = "fallback", f"fallback after {previous.label}{failure}"
        return {"switchyard.attempt.kind": kind, "switchyard.attempt.reason": reason}

    def _call(self, call: _Call, start: float, why: Attributes) -> ReadableSpan:
        provider, _, model = call.label.partition("/")
        attempt, state = call.attempt, None
        attributes: Attributes = {
            "gen_ai.operation.name": self.operation,
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "switchyard.target": call.label,
            **why,
        }
        if (strategy := self.record.trace.reasons.get(call.label)) is not None:
            attributes["switchyard.route.reason"] = strategy
        if attempt is None:
            outcome, end = "cancelled", self.ended
        elif attempt.error is not None:
            outcome, end = "error", attempt.ended
            attributes["error.type"] = attempt.error
            state = Status(StatusCode.ERROR, attempt.error)
        else:
            outcome, end = "ok", attempt.ended
        attributes["switchyard.attempt.outcome"] = outcome
        name = f"{self.operation} {model}"
        span_id, kind = call.span_id, SpanKind.CLIENT
        return self._span(self.root, name, span_id, start, end, kind, attributes, state)

    def _routing_began(self) -> float:
        """When calls could start (for a call that never reported back: no time of its own)."""
        before = [p.end for p in self.record.phases if p.name != "ledger.commit"]
        return max(before, default=self.record.started)

    def _span(
        self,
        parent: SpanContext | None,
        name: str,
        span_id: str,
        start: float,
        end: float,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes | None = None,
        status: Status | None = None,
    ) -> ReadableSpan:
        return ReadableSpan(
            name,
            context=self._context(span_id),
            parent=parent,
            resource=self.tracing.resource,
            attributes=attributes or {},
            kind=kind,
            status=status or _UNSET,
            start_time=self._ns(start),
            end_time=self._ns(max(start, end)),
            instrumentation_scope=self.tracing.scope,
        )

    def _context(self, span_id: str) -> SpanContext:
        return SpanContext(self.trace_id, int(span_id, 16), False, _SAMPLED)

    def _ns(self, monotonic: float) -> int:
        """A record time (monotonic seconds) as Unix nanoseconds."""
        return int((self.record.wall_started + (monotonic - self.record.started)) * 1e9)


class _Call(NamedTuple):
    """One upstream call: its target, the span id its ``traceparent`` named, and the
    attempt it became (None: it never reported back)."""

    label: str
    span_id: str
    attempt: Attempt | None
