"""``POST /v1/chat/completions``: decode, plan, execute, answer (JSON or SSE)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import structlog
from litestar import Request, Response, post
from litestar.response import Stream

from core.errors import GatewayError, UpstreamServerError
from core.wire import ChatRequest, ChatResult, StreamOptions, StreamPart, encoder
from gateway import sse
from gateway.context import RequestRecord
from gateway.errors import decode_body
from gateway.state import GatewayState
from routers.executor import Trace, close_stream
from routers.filters import filter_capable
from routers.targets import Target

_decoder = msgspec.json.Decoder(ChatRequest)
_JSON = "application/json"
CLIENT_CLOSED = 499  # nginx's code: the client went away before the end


def decode_chat(raw: bytes) -> ChatRequest:
    request: ChatRequest = decode_body(_decoder, raw)
    return request


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:
    state: GatewayState = request.app.state.gateway
    record = RequestRecord(request, "chat")
    try:
        raw = await request.body()
        req = decode_chat(raw)
        record.model, record.stream = req.model, req.stream
        runtime = state.runtime
        targets, skipped = runtime.plan_for(req.model)
        plan, unable = filter_capable(req, targets)
        record.trace = trace = Trace([*skipped, *unable])
        if req.stream:
            return await _open_stream(state, record, req, raw, plan, trace)
        result: ChatResult = await runtime.executor.call(
            req.model, plan, lambda t: t.provider.chat(req, record.call_context(t, raw)), trace
        )
    except GatewayError as exc:
        record.finish(exc.status, exc)
        raise
    record.usage = result.response.usage
    record.finish(200)
    body = result.raw if result.raw is not None else encoder.encode(result.response)
    return Response(body, media_type=_JSON, headers=record.headers())


async def _open_stream(
    state: GatewayState,
    record: RequestRecord,
    req: ChatRequest,
    raw: bytes,
    plan: list[Target],
    trace: Trace,
) -> Response[Any]:
    """Wait for the first chunk (falling back until one comes), then commit to SSE."""
    client_wants_usage = req.wants_usage_in_stream()
    upstream_req = msgspec.structs.replace(req, stream_options=StreamOptions(include_usage=True))
    first, rest = await state.runtime.executor.open_stream(
        req.model,
        plan,
        lambda t: t.provider.stream_chat(upstream_req, record.call_context(t, raw)),
        trace,
    )
    record.first_byte()
    body = _stream_body(record, first, rest, client_wants_usage)
    return Stream(body, media_type="text/event-stream", headers=_sse_headers(record))


def _sse_headers(record: RequestRecord) -> dict[str, str]:
    return {**record.headers(), "cache-control": "no-cache", "x-accel-buffering": "no"}


def _encode_part(part: StreamPart, record: RequestRecord, wants_usage: bool) -> bytes | None:
    chunk = part.chunk
    if chunk.usage is not None:
        record.usage = chunk.usage
        if not chunk.choices and not wants_usage:
            return None  # asked upstream for the gateway's own accounting only
    return sse.frame(part.raw if part.raw is not None else encoder.encode(chunk))


async def _stream_body(
    record: RequestRecord,
    first: StreamPart,
    rest: AsyncIterator[StreamPart],
    wants_usage: bool,
) -> AsyncIterator[bytes]:
    """The SSE body. A failure after the first byte becomes an error event and a clean
    close; a client that goes away cancels this generator, which closes the upstream."""
    status: int = CLIENT_CLOSED
    error: GatewayError | None = None
    try:
        framed = _encode_part(first, record, wants_usage)
        if framed is not None:
            yield framed
        async for part in rest:
            framed = _encode_part(part, record, wants_usage)
            if framed is not None:
                yield framed
        yield sse.DONE
        status = 200
    except GatewayError as exc:
        status, error = exc.status, exc
        yield sse.error_frame(exc)
    except Exception as exc:  # a bug must still end the stream with an error event
        status, error = 500, UpstreamServerError(f"stream failed: {type(exc).__name__}")
        structlog.get_logger("switchyard").exception("stream.failed")
        yield sse.error_frame(error)
    finally:
        await close_stream(rest)
        record.finish(status, error)
