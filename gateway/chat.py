"""``POST /v1/chat/completions``: decode, plan, execute, answer (JSON or SSE)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.response import Stream

from core.errors import GatewayError
from core.wire import ChatRequest, ChatResult, StreamOptions, StreamPart, encoder
from gateway import caching, sse
from gateway.context import RequestRecord
from gateway.errors import decode_body
from gateway.pipeline import CLIENT_CLOSED, Scope
from routers.executor import close_stream
from routers.targets import Target

_decoder = msgspec.json.Decoder(ChatRequest)
_JSON = "application/json"


def decode_chat(raw: bytes) -> ChatRequest:
    request: ChatRequest = decode_body(_decoder, raw)
    return request


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:
    scope = Scope(request, "chat")
    record = scope.record
    try:
        scope.authenticate()
        raw = await scope.read_body(request)
        req = decode_chat(raw)
        record.stream = req.stream
        scope.authorize(req.model)
        plan = scope.plan_chat(req)
        assert scope.route is not None
        await scope.admit(plan, scope.route.prompt_tokens, scope.route.output_tokens)
        cache = caching.CacheUse(scope, req, raw)
        hit = await cache.lookup()
        if hit is not None:
            return await caching.replay(scope, req, hit)
        plan = await scope.wait_for_capacity(plan)
        await scope.prefer_sticky(plan, req)
        scope.use_provider_caches()
        if req.stream:
            return await _open_stream(scope, req, raw, plan.ordered, cache)
        result: ChatResult = await scope.runtime.executor.call(
            req.model,
            plan.ordered,
            lambda t: t.provider.chat(req, record.call_context(t, raw)),
            record.trace,
            observer=scope.observer,
            gate=scope.state.trackers.breakers.gate,
        )
    except BaseException as exc:
        await scope.close(*scope.fail(exc))
        raise
    record.usage = result.response.usage
    await scope.close(200)
    cache.store(result.response)
    body = result.raw if result.raw is not None else encoder.encode(result.response)
    return Response(body, media_type=_JSON, headers=record.headers())


async def _open_stream(
    scope: Scope,
    req: ChatRequest,
    raw: bytes,
    plan: list[Target],
    cache: caching.CacheUse,
) -> Response[Any]:
    """Wait for the first chunk (falling back until one comes), then commit to SSE."""
    record = scope.record
    client_wants_usage = req.wants_usage_in_stream()
    upstream_req = msgspec.structs.replace(req, stream_options=StreamOptions(include_usage=True))
    first, rest = await scope.runtime.executor.open_stream(
        req.model,
        plan,
        lambda t: t.provider.stream_chat(upstream_req, record.call_context(t, raw)),
        record.trace,
        observer=scope.observer,
        gate=scope.state.trackers.breakers.gate,
    )
    scope.hold(rest)
    record.first_byte()
    body = _stream_body(scope, first, rest, client_wants_usage, cache)
    scope.hold(body)
    return Stream(body, media_type="text/event-stream", headers=sse_headers(record))


def sse_headers(record: RequestRecord) -> dict[str, str]:
    return {**record.headers(), "cache-control": "no-cache", "x-accel-buffering": "no"}


def _encode_part(
    part: StreamPart, record: RequestRecord, wants_usage: bool, collected: caching.Collector
) -> bytes | None:
    chunk = part.chunk
    collected.add(chunk)
    if chunk.usage is not None:
        record.usage = chunk.usage
        if not chunk.choices and not wants_usage:
            return None  # asked upstream for the gateway's own accounting only
    return sse.frame(part.raw if part.raw is not None else encoder.encode(chunk))


async def _stream_body(
    scope: Scope,
    first: StreamPart,
    rest: AsyncIterator[StreamPart],
    wants_usage: bool,
    cache: caching.CacheUse,
) -> AsyncIterator[bytes]:
    """The SSE body. A failure after the first byte becomes an error event and a clean
    close; a client that goes away cancels this generator, which closes the upstream. The
    ledger row is committed before ``[DONE]`` (and also when the client went away)."""
    record = scope.record
    status: int = CLIENT_CLOSED
    error: GatewayError | None = None
    collected = cache.collector()
    try:
        framed = _encode_part(first, record, wants_usage, collected)
        if framed is not None:
            yield framed
        async for part in rest:
            if scope.client_gone:
                return  # ends as 499 in ``finally``; closes the upstream
            framed = _encode_part(part, record, wants_usage, collected)
            if framed is not None:
                yield framed
        status = 200
        await close_stream(rest)
        await scope.close(status)
        cache.store_collected(collected)
        yield sse.DONE
    except Exception as exc:  # a bug must still end the stream with an error event
        status, error = scope.fail(exc)
        assert error is not None
        yield sse.error_frame(error)
    finally:
        await close_stream(rest)
        await scope.close(status, error)
