"""Per-request bookkeeping: the request id, timings, the trace, and the one log line."""

from __future__ import annotations

import os
import re
import time
from typing import Any, NamedTuple

import structlog
from litestar import Request

from core.errors import GatewayError
from core.protocols import CallContext
from core.tenancy import OPEN, Principal, UsageRow
from core.tracecontext import upstream_traceparent
from core.wire import ChatChunk, ChatResponse, Usage, make_usage
from gateway.telemetry.trace_ids import TraceIds, new_span_id
from routers.targets import Target
from routers.trace import Trace

_log = structlog.get_logger("switchyard")
SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")  # client ids the gateway echoes


GATEWAY_ID_HEADER = "x-switchyard-request-id"
CAPTURE_MAX_CHARS = 65_536  # completion text kept for a trace (capture_content only)


def new_request_id() -> str:
    """A fresh gateway request id: 96 random bits, so ids never collide in practice."""
    return "req_" + os.urandom(12).hex()


def client_request_id(request: Request[Any, Any, Any]) -> str | None:
    """The client's ``x-request-id`` when it is a sane token (else None). Used for
    correlation only: echoed back, logged, stored beside the row; never as an identity."""
    supplied = request.headers.get("x-request-id")
    if supplied and SAFE_ID.match(supplied):
        return supplied
    return None


class Phase(NamedTuple):
    """A step of the request's pass (``time.monotonic()`` seconds), for its trace span."""

    name: str
    start: float
    end: float


class RequestRecord:
    """Collects what one request did and writes ``request.completed`` exactly once.

    Timings are ``time.monotonic()`` seconds (the executor's clock, so attempts line up);
    ``wall_started`` anchors them to Unix time for exported spans."""

    def __init__(self, request: Request[Any, Any, Any], endpoint: str) -> None:
        # The gateway's own id keys quota leases, ledger rows and their dedup; a client
        # that reuses or guesses ids must not share a lease or suppress a row (issue 10).
        self.request_id = new_request_id()
        self.client_request_id = client_request_id(request)
        request.scope.setdefault("state", {})["request_id"] = self.echo_id
        self.endpoint = endpoint
        self.started = time.monotonic()
        self.wall_started = time.time()
        self.ended: float | None = None  # set by ``finish``
        self.phases: list[Phase] = []  # authenticate, quota admission, queue, ledger...
        # Set when tracing is on: the trace's ids, and one span id per upstream call in
        # the order the calls were made (label, span id), named in its ``traceparent``.
        self.trace_ids: TraceIds | None = None
        self.call_spans: list[tuple[str, str]] = []
        self.model: str | None = None
        self.stream = False
        self.trace = Trace()
        self.usage: Usage | None = None
        self.usage_estimated = False  # a stream cut before the upstream reported usage
        self.streamed_chars = 0  # generated text sent so far (content, reasoning, tool args)
        self.ttft_s: float | None = None
        # Goodput (``policies.goodput``): the TTFT objective routing resolved, and whether
        # the request met it (None: it had none), set as the request ends.
        self.slo_ttft_ms: float | None = None
        self.slo_met: bool | None = None
        self.principal: Principal = OPEN
        # x-ratelimit-*, cache and queue reports; error responses carry them too
        self.extra_headers: dict[str, str] = {GATEWAY_ID_HEADER: self.request_id}
        self.queue_s = 0.0
        self.cache_hit = False
        self.cost_usd = 0.0
        self.hedge_cost_usd = 0.0  # the hedge loser's prompt, at its price (not billed)
        self.prompt_cache_key: str | None = None
        self.cache_control_min_chars: int | None = None
        # Prompt and completion text for the trace, kept only when tracing captures content
        # (``observability.tracing.capture_content``, set by ``Telemetry.started``): the
        # request path fills them behind ``if record.capture_content``, so the default
        # costs one attribute test. ``content_in``: the messages as JSON (OpenAI's shape);
        # ``content_out``: the generated text, at most ``CAPTURE_MAX_CHARS``.
        self.capture_content = False
        self.priority = 0  # the engine priority calls carry (CallContext.priority)
        self.finish_reasons: list[str] = []  # per choice, as the answer ended (for traces)
        self.content_in: str | None = None
        self.content_out: str | None = None
        self._done = False

    def call_context(self, target: Target, raw: bytes) -> CallContext:
        """What one call to ``target`` needs; ``raw`` is the client's body, for passthrough.
        Called as the call is made: with tracing on, it names the call's span in the
        ``traceparent`` the provider sends (``core.tracecontext``)."""
        if self.trace_ids is not None:
            span_id = new_span_id()
            self.call_spans.append((target.label, span_id))
            upstream_traceparent.set(self.trace_ids.traceparent(span_id))
        return CallContext(
            request_id=self.request_id,
            upstream_model=target.model,
            timeouts=target.timeouts,
            raw_body=raw,
            tenant=self.principal.tenant,
            prompt_cache_key=self.prompt_cache_key,
            cache_control_min_chars=self.cache_control_min_chars,
            priority=self.priority,
        )

    @property
    def echo_id(self) -> str:
        """What ``x-request-id`` answers: the client's id when it sent one, else ours."""
        return self.client_request_id or self.request_id

    def streamed(self, chunk: ChatChunk) -> None:
        """Count the generated text of a chunk that is being sent to the client, and keep
        the finish reasons it carries."""
        for choice in chunk.choices:
            if choice.finish_reason is not None:
                self.finish_reasons.append(choice.finish_reason)
            delta = choice.delta
            self.streamed_chars += len(delta.content or "") + len(delta.reasoning_content or "")
            for call in delta.tool_calls or ():
                if call.function is not None:
                    self.streamed_chars += len(call.function.arguments or "")

    def answered(self, response: ChatResponse) -> None:
        """A whole answer (upstream or cache): keep its usage, its finish reasons and, when
        content is captured, its text."""
        self.usage = response.usage
        self.finish_reasons = [c.finish_reason for c in response.choices if c.finish_reason]
        if self.capture_content:
            self.capture_answer(response)

    def capture_answer(self, answer: ChatChunk | ChatResponse) -> None:
        """Append the text of a streamed chunk (or of a whole answer) to ``content_out``,
        up to ``CAPTURE_MAX_CHARS`` (so the copies stay bounded). Call only when
        ``capture_content`` is set."""
        kept = self.content_out or ""
        if len(kept) >= CAPTURE_MAX_CHARS:
            return
        if isinstance(answer, ChatChunk):
            texts = [choice.delta.content for choice in answer.choices]
        else:
            texts = [choice.message.content for choice in answer.choices]
        added = "".join(text for text in texts if text)
        self.content_out = (kept + added)[:CAPTURE_MAX_CHARS]

    def estimate_cut_usage(self, prompt_tokens: int) -> None:
        """A stream that ended before the upstream's usage chunk (the client left, or the
        upstream failed mid-stream) still cost upstream tokens: bill the prompt estimate
        and the text streamed so far (characters / 4, at least 1 token), marked estimated."""
        if self.usage is not None or self.streamed_chars == 0 or self.cache_hit:
            return
        completion = max(1, -(-self.streamed_chars // 4))
        self.usage = make_usage(prompt_tokens, completion)
        self.usage_estimated = True

    def timed(self, name: str) -> _Timed:
        """``with record.timed("quota.admit"):`` records the block as a phase, also when
        it raises or is cancelled."""
        return _Timed(self.phases, name)

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def first_byte(self) -> None:
        if self.ttft_s is None:
            self.ttft_s = time.monotonic() - self.started

    def headers(self) -> dict[str, str]:
        """Response headers that say what happened."""
        headers = {"x-request-id": self.echo_id, **self.extra_headers}
        served = self.trace.served_by
        if served is not None:
            headers["x-switchyard-provider"] = served.provider_name
            headers["x-switchyard-upstream-model"] = served.model
            headers["x-switchyard-attempts"] = str(len(self.trace.attempts))
            headers["x-switchyard-route-reason"] = self.trace.route_reason()
        return headers

    def usage_row(self, status: int, error: GatewayError | None, wall: float) -> UsageRow:
        """The ledger row for this request as it stands (``wall``: Unix seconds now)."""
        served = self.trace.served_by
        usage = self.usage
        latency = self.elapsed_s()
        return UsageRow(
            request_id=self.request_id,
            ts=wall - latency,
            tenant=self.principal.tenant,
            key_id=self.principal.key_id,
            model=self.model,
            provider=served.provider_name if served else None,
            upstream_model=served.model if served else None,
            endpoint=self.endpoint,
            stream=self.stream,
            status=status,
            error=_error_name(error),
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            cached_tokens=(usage.cached_tokens or 0) if usage else 0,
            cost_usd=self.cost_usd,
            ttft_ms=round(self.ttft_s * 1000, 3) if self.ttft_s is not None else None,
            latency_ms=round(latency * 1000, 3),
            queue_ms=round(self.queue_s * 1000, 3),
            attempts=len(self.trace.attempts),
            fallbacks=self.trace.fallbacks,
            cache_hit=self.cache_hit,
            client_request_id=self.client_request_id,
            usage_estimated=self.usage_estimated,
            tags=self.principal.tags,
        )

    def finish(self, status: int, error: GatewayError | None = None) -> None:
        """Write the one ``request.completed`` line (only the first call counts)."""
        if self._done:
            return
        self._done = True
        served = self.trace.served_by
        usage = self.usage
        self.ended = time.monotonic()
        latency = self.ended - self.started
        _log.info(
            "request.completed",
            request_id=self.request_id,
            client_request_id=self.client_request_id,
            endpoint=self.endpoint,
            tenant=self.principal.tenant,
            key_id=self.principal.key_id,
            model=self.model,
            provider=served.provider_name if served else None,
            upstream_model=served.model if served else None,
            status=status,
            stream=self.stream,
            attempts=len(self.trace.attempts),
            fallbacks=self.trace.fallbacks,
            latency_ms=round(latency * 1000, 2),
            ttft_ms=round((self.ttft_s if self.ttft_s is not None else latency) * 1000, 2),
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            cached_tokens=usage.cached_tokens if usage else None,
            cost_usd=round(self.cost_usd, 8),
            hedged=self.trace.hedge is not None,
            hedge_cost_usd=round(self.hedge_cost_usd, 8),
            queue_ms=round(self.queue_s * 1000, 2),
            cache_hit=self.cache_hit,
            usage_estimated=self.usage_estimated,
            slo_ttft_ms=self.slo_ttft_ms,
            slo_met=self.slo_met,
            error=_error_name(error),
        )


class _Timed:
    """The context manager behind ``RequestRecord.timed`` (a class: cheaper per request
    than ``contextlib.contextmanager``)."""

    __slots__ = ("_name", "_phases", "_since")

    def __init__(self, phases: list[Phase], name: str) -> None:
        self._phases, self._name = phases, name
        self._since = 0.0

    def __enter__(self) -> None:
        self._since = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self._phases.append(Phase(self._name, self._since, time.monotonic()))


def _error_name(error: GatewayError | None) -> str | None:
    return (error.code or type(error).__name__) if error else None
