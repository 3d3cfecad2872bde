"""One conversational request, whatever the client's dialect: the pipeline written once.

Chat Completions, Anthropic Messages and the Responses API differ only in how a body is
read and how an answer is written; an ``Ingress`` (made by a dialect's ``decode``) does
both around the canonical ``ChatRequest``. Everything between (authenticate, plan, admit
the quota, the response cache, the admission queue, sticky routing, execute with
fallback, settle, ledger row, log line, headers) is ``serve_chat``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import msgspec
from litestar import Request, Response
from litestar.response import Stream

from core.errors import GatewayError
from core.protocols import CallContext
from core.wire import (
    ChatChunk,
    ChatRequest,
    ChatResponse,
    ChatResult,
    StreamOptions,
    StreamPart,
    Usage,
)
from gateway.request import caching
from gateway.request.scope import Scope
from gateway.request.stream import (
    StreamCodec,
    encode_all,
    keep_chunk,
    sse_headers,
    sse_response,
)
from gateway.telemetry.record import RequestRecord
from policies.response_cache import chunks_of
from routers.planner import Plan
from routers.targets import Target

_JSON = "application/json"


class Ingress(Protocol):
    """One decoded request in a client's dialect."""

    @property
    def chat(self) -> ChatRequest:
        """The canonical request the pipeline routes."""
        ...

    @property
    def upstream_body(self) -> bytes:
        """The body OpenAI-compatible upstreams get forwarded (with the model replaced):
        the client's own for Chat Completions, the canonical request's JSON otherwise."""
        ...

    def body(self, result: ChatResult) -> bytes:
        """The JSON answer for a complete result."""
        ...

    def codec(self, record: RequestRecord) -> StreamCodec[StreamPart]:
        """The stream writer for this request (``record.trace.served_by`` says which
        target's stream it writes)."""
        ...

    def native_call(self, target: Target, ctx: CallContext) -> Awaitable[ChatResult] | None:
        """A call in the client's own dialect when ``target`` speaks it (the body passed
        through, no round trip through the canonical form), else None: the canonical call."""
        ...

    def native_stream(self, target: Target, ctx: CallContext) -> AsyncIterator[StreamPart] | None:
        """The streaming twin of ``native_call``."""
        ...


Decode = Callable[[bytes], Ingress]


async def serve_chat(
    request: Request[Any, Any, Any], endpoint: str, decode: Decode
) -> Response[Any]:
    """Answer one conversational request of ``endpoint`` (the ledger's name for it)."""
    scope = Scope(request, endpoint)
    record = scope.record
    try:
        scope.authenticate()
        raw = await scope.read_body(request)
        ingress = decode(raw)
        req = ingress.chat
        record.stream = req.stream
        if record.capture_content:
            record.content_in = msgspec.json.encode(req.messages).decode()
        scope.authorize(req.model)
        plan = scope.plan_chat(req)
        assert scope.route is not None
        await scope.admit(plan, scope.route.prompt_tokens, scope.route.output_tokens)
        upstream_body = ingress.upstream_body
        cache = caching.CacheUse(scope, req, upstream_body)
        hit = await cache.lookup()
        if hit is not None:
            return await _replay(scope, ingress, hit)
        plan = await scope.wait_for_capacity(plan)
        await scope.prefer_sticky(plan, req)
        scope.use_provider_caches()
        if req.stream:
            return await _open_stream(scope, ingress, plan, cache)

        def call(target: Target) -> Awaitable[ChatResult]:
            ctx = record.call_context(target, upstream_body)
            return ingress.native_call(target, ctx) or target.provider.chat(req, ctx)

        result: ChatResult = await scope.call(req.model, plan, call)
    except BaseException as exc:
        await scope.close(*scope.fail(exc))
        raise
    record.answered(result.response)
    await scope.close(200)
    cache.store(result.response)
    return Response(ingress.body(result), media_type=_JSON, headers=record.headers())


async def _open_stream(
    scope: Scope, ingress: Ingress, plan: Plan, cache: caching.CacheUse
) -> Response[Any]:
    """Wait for the first chunk (falling back until one comes), then commit to SSE. The
    upstream is always asked for usage: the gateway's accounting needs it."""
    record = scope.record
    req = ingress.chat
    upstream = msgspec.structs.replace(req, stream_options=StreamOptions(include_usage=True))
    body = ingress.upstream_body

    def stream(target: Target) -> AsyncIterator[StreamPart]:
        ctx = record.call_context(target, body)
        return ingress.native_stream(target, ctx) or target.provider.stream_chat(upstream, ctx)

    first, rest = await scope.open_stream(req.model, plan, stream)
    codec = _Caching(ingress.codec(record), cache)
    return sse_response(scope, first, rest, codec, keep_chunk)


async def _replay(scope: Scope, ingress: Ingress, hit: ChatResponse) -> Response[Any]:
    """Answer from the response cache, as JSON or as a stream in the client's dialect."""
    record = scope.record
    record.cache_hit = True
    record.answered(hit)
    await scope.close(200)
    headers = record.headers()
    if not ingress.chat.stream:
        return Response(ingress.body(ChatResult(hit)), media_type=_JSON, headers=headers)
    codec = ingress.codec(record)
    record.first_byte()
    parts = [StreamPart(chunk) for chunk in chunks_of(hit, include_usage=True)]
    return Stream(
        _iterate(encode_all(record, parts, codec, keep_chunk)),
        media_type="text/event-stream",
        headers=sse_headers(record),
    )


async def _iterate(frames: list[bytes]) -> AsyncIterator[bytes]:
    for frame in frames:
        yield frame


class _Caching:
    """A codec that also folds the stream into the response cache (complete streams only)."""

    def __init__(self, inner: StreamCodec[StreamPart], cache: caching.CacheUse) -> None:
        self.inner = inner
        self.cache = cache
        self.collected = cache.collector()

    def start(self) -> bytes:
        return self.inner.start()

    def frame(self, part: StreamPart) -> bytes:
        self.collected.add(part.chunk)
        return self.inner.frame(part)

    def end(self) -> bytes:
        self.cache.store_collected(self.collected)
        return self.inner.end()

    def error(self, exc: GatewayError) -> bytes:
        return self.inner.error(exc)


class CanonicalStreamCodec:
    """Adapts a dialect's chunk encoder (``start``/``feed``/``finish``/``error``) to a
    ``StreamCodec``: the last events get the usage the record kept and the finish reason
    the chunks said."""

    def __init__(self, record: RequestRecord, encoder: ChunkEncoder) -> None:
        self.record = record
        self.encoder = encoder
        self.finish_reason: str | None = None

    def start(self) -> bytes:
        return self.encoder.start()

    def frame(self, part: StreamPart) -> bytes:
        chunk = part.chunk
        for choice in chunk.choices:
            if choice.finish_reason is not None:
                self.finish_reason = choice.finish_reason
        return self.encoder.feed(chunk)

    def end(self) -> bytes:
        return self.encoder.finish(self.record.usage, self.finish_reason)

    def error(self, exc: GatewayError) -> bytes:
        return self.encoder.error(exc)


class ChunkEncoder(Protocol):
    def start(self) -> bytes: ...

    def feed(self, chunk: ChatChunk) -> bytes: ...

    def finish(self, usage: Usage | None, finish_reason: str | None) -> bytes: ...

    def error(self, exc: GatewayError) -> bytes: ...
