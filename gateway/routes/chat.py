"""``POST /v1/chat/completions``: decode, plan, execute, answer (JSON or SSE)."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, post

from core.errors import GatewayError
from core.wire import ChatRequest, ChatResult, StreamOptions, StreamPart, encoder
from gateway.http import sse
from gateway.http.errors import decode_body
from gateway.request import caching
from gateway.request.record import RequestRecord
from gateway.request.scope import Scope
from gateway.request.stream import sse_response
from routers.planner import Plan

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
            return await _open_stream(scope, req, raw, plan, cache)
        result: ChatResult = await scope.call(
            req.model, plan, lambda t: t.provider.chat(req, record.call_context(t, raw))
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
    plan: Plan,
    cache: caching.CacheUse,
) -> Response[Any]:
    """Wait for the first chunk (falling back until one comes), then commit to SSE."""
    record = scope.record
    upstream_req = msgspec.structs.replace(req, stream_options=StreamOptions(include_usage=True))
    first, rest = await scope.open_stream(
        req.model, plan, lambda t: t.provider.stream_chat(upstream_req, record.call_context(t, raw))
    )
    codec = ChatStreamCodec(record, req.wants_usage_in_stream(), cache)
    return sse_response(scope, first, rest, codec)


class ChatStreamCodec:
    """OpenAI's chat SSE: each chunk as ``data: <json>`` (the upstream's own bytes when it
    sent them), ``data: [DONE]`` at the end. Usage is always asked of the upstream, for the
    gateway's accounting; its usage-only chunk reaches the client only when it asked."""

    def __init__(self, record: RequestRecord, wants_usage: bool, cache: caching.CacheUse) -> None:
        self.record = record
        self.wants_usage = wants_usage
        self.cache = cache
        self.collected = cache.collector()

    def start(self) -> bytes:
        return b""

    def frame(self, part: StreamPart) -> bytes:
        chunk = part.chunk
        self.collected.add(chunk)
        if chunk.usage is not None:
            self.record.usage = chunk.usage
            if not chunk.choices and not self.wants_usage:
                return b""
        return sse.frame(part.raw if part.raw is not None else encoder.encode(chunk))

    def end(self) -> bytes:
        self.cache.store_collected(self.collected)
        return sse.DONE

    def error(self, exc: GatewayError) -> bytes:
        return sse.error_frame(exc)
