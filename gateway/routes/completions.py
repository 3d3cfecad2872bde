"""``POST /v1/completions`` (legacy text completions): OpenAI-compatible upstreams and the
local engine; bodies forwarded raw, answered as the upstream wrote them (JSON or SSE)."""

from __future__ import annotations

from typing import Any, cast

import msgspec
from litestar import Request, Response, post

from core.errors import GatewayError
from core.protocols import CompletionProvider
from core.wire import CompletionRequest, RawResult, RawStreamPart
from gateway.http import sse
from gateway.http.errors import decode_body
from gateway.request.routing_view import completion_output_tokens
from gateway.request.scope import Scope, body_tokens
from gateway.request.stream import keep_raw, sse_response

_decoder = msgspec.json.Decoder(CompletionRequest)


@post("/v1/completions", status_code=200)
async def completions(request: Request[Any, Any, Any]) -> Response[Any]:
    scope = Scope(request, "completions")
    record = scope.record
    try:
        scope.authenticate()
        raw = await scope.read_body(request)
        req: CompletionRequest = decode_body(_decoder, raw)
        record.stream = req.stream
        scope.authorize(req.model)
        prompt = body_tokens(raw)
        output = completion_output_tokens(req, scope.runtime.config.routing.max_n)
        plan = scope.plan_other(
            req.model, CompletionProvider, "completions", prompt, req.max_tokens
        )
        await scope.admit(plan, prompt, output)
        plan = await scope.wait_for_capacity(plan)
        ctx = record.call_context
        if req.stream:
            first, rest = await scope.open_stream(
                req.model,
                plan,
                lambda t: cast(CompletionProvider, t.provider).stream_complete(req, ctx(t, raw)),
            )
            wants_usage = req.stream_options is not None and req.stream_options.include_usage
            return sse_response(scope, first, rest, RawStreamCodec(wants_usage), keep_raw)
        result: RawResult = await scope.call(
            req.model,
            plan,
            lambda t: cast(CompletionProvider, t.provider).complete(req, ctx(t, raw)),
        )
    except BaseException as exc:
        await scope.close(*scope.fail(exc))
        raise
    return await scope.answer_raw(result)


class RawStreamCodec:
    """The upstream's own SSE events, passed through; usage-only events reach the client
    only when it asked for them (the gateway always asks, for its accounting: ``keep_raw``
    keeps their usage)."""

    def __init__(self, wants_usage: bool) -> None:
        self.wants_usage = wants_usage

    def start(self) -> bytes:
        return b""

    def frame(self, part: RawStreamPart) -> bytes:
        return sse.frame(part.data) if part.has_choices or self.wants_usage else b""

    def end(self) -> bytes:
        return sse.DONE

    def error(self, exc: GatewayError) -> bytes:
        return sse.error_frame(exc)
