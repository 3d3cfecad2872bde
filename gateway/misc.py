"""Models, health, readiness, embeddings and legacy completions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import msgspec
from litestar import Request, Response, get, post
from litestar.response import Stream

from core.errors import GatewayError, InvalidRequestError, ModelNotFoundError
from core.protocols import CompletionProvider, EmbeddingProvider
from core.wire import (
    CompletionRequest,
    EmbeddingRequest,
    ModelCard,
    ModelList,
    RawResult,
    RawStreamPart,
    encoder,
)
from gateway import sse
from gateway.context import RequestRecord
from gateway.errors import decode_body
from gateway.state import GatewayState
from routers.executor import Trace, close_stream
from routers.targets import Skipped, Target

_JSON = "application/json"
_embedding_decoder = msgspec.json.Decoder(EmbeddingRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)


def _state(request: Request[Any, Any, Any]) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


def _cards(state: GatewayState) -> list[ModelCard]:
    config = state.runtime.config
    created = state.created
    return [ModelCard(alias, created, m.owned_by) for alias, m in config.models.items()]


@get("/v1/models")
async def list_models(request: Request[Any, Any, Any]) -> Response[bytes]:
    body = encoder.encode(ModelList(_cards(_state(request))))
    return Response(body, media_type=_JSON)


@get("/v1/models/{model_id:path}")
async def get_model(request: Request[Any, Any, Any], model_id: str) -> Response[bytes]:
    model_id = model_id.lstrip("/")
    for card in _cards(_state(request)):
        if card.id == model_id:
            return Response(encoder.encode(card), media_type=_JSON)
    raise ModelNotFoundError(f"The model '{model_id}' does not exist.", param="model")


@get("/healthz")
async def healthz() -> Response[bytes]:
    """Liveness: the process answers. Readiness is /readyz."""
    return Response(b'{"status":"ok"}', media_type=_JSON)


@get("/readyz")
async def readyz(request: Request[Any, Any, Any]) -> Response[bytes]:
    """200 once every enabled provider is ready (local models loaded, compiled, probed)."""
    state = _state(request)
    providers = {name: p.is_ready() for name, p in state.runtime.providers.items()}
    failed = state.startup_failed()
    ready = all(providers.values()) and failed is None
    body = {
        "status": "ready" if ready else ("failed" if failed else "starting"),
        "providers": providers,
        "disabled": {d.name: d.reason for d in state.runtime.disabled},
    }
    if failed is not None:
        body["error"] = str(failed)
    return Response(encoder.encode(body), media_type=_JSON, status_code=200 if ready else 503)


def _plan(
    state: GatewayState, model: str, capability: str, kind: type
) -> tuple[list[Target], list[Skipped]]:
    targets, skipped = state.runtime.plan_for(model)
    capable = [t for t in targets if isinstance(t.provider, kind)]
    if targets and not capable:
        raise InvalidRequestError(
            f"model '{model}' does not support {capability}",
            param="model",
            code="unsupported_endpoint",
        )
    return capable, skipped


def _answer(record: RequestRecord, result: RawResult) -> Response[bytes]:
    record.usage = result.usage
    record.finish(200)
    return Response(result.body, media_type=_JSON, headers=record.headers())


@post("/v1/embeddings", status_code=200)
async def embeddings(request: Request[Any, Any, Any]) -> Response[bytes]:
    state = _state(request)
    record = RequestRecord(request, "embeddings")
    try:
        raw = await request.body()
        req = decode_body(_embedding_decoder, raw)
        record.model = req.model
        plan, skipped = _plan(state, req.model, "embeddings", EmbeddingProvider)
        record.trace = Trace(skipped)
        result: RawResult = await state.runtime.executor.call(
            req.model,
            plan,
            lambda t: cast(EmbeddingProvider, t.provider).embed(req, record.call_context(t, raw)),
            record.trace,
        )
    except GatewayError as exc:
        record.finish(exc.status, exc)
        raise
    return _answer(record, result)


@post("/v1/completions", status_code=200)
async def completions(request: Request[Any, Any, Any]) -> Response[Any]:
    state = _state(request)
    record = RequestRecord(request, "completions")
    try:
        raw = await request.body()
        req: CompletionRequest = decode_body(_completion_decoder, raw)
        record.model, record.stream = req.model, req.stream
        plan, skipped = _plan(state, req.model, "completions", CompletionProvider)
        record.trace = Trace(skipped)
        executor = state.runtime.executor
        if req.stream:
            first, rest = await executor.open_stream(
                req.model,
                plan,
                lambda t: cast(CompletionProvider, t.provider).stream_complete(
                    req, record.call_context(t, raw)
                ),
                record.trace,
            )
            record.first_byte()
            body = _raw_stream(
                record,
                first,
                rest,
                req.stream_options is not None and req.stream_options.include_usage,
            )
            headers = {**record.headers(), "cache-control": "no-cache"}
            return Stream(body, media_type="text/event-stream", headers=headers)
        result: RawResult = await executor.call(
            req.model,
            plan,
            lambda t: cast(CompletionProvider, t.provider).complete(
                req, record.call_context(t, raw)
            ),
            record.trace,
        )
    except GatewayError as exc:
        record.finish(exc.status, exc)
        raise
    return _answer(record, result)


async def _raw_stream(
    record: RequestRecord,
    first: RawStreamPart,
    rest: AsyncIterator[RawStreamPart],
    wants_usage: bool,
) -> AsyncIterator[bytes]:
    status, error = 499, None
    try:
        part: RawStreamPart | None = first
        while part is not None:
            if part.usage is not None:
                record.usage = part.usage
            if part.has_choices or wants_usage:
                yield sse.frame(part.data)
            part = await anext(rest, None)
        yield sse.DONE
        status = 200
    except GatewayError as exc:
        status, error = exc.status, exc
        yield sse.error_frame(exc)
    finally:
        await close_stream(rest)
        record.finish(status, error)
