"""Models, health, readiness, embeddings and legacy completions."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import msgspec
from litestar import Request, Response, get, post
from litestar.response import Stream

from core.errors import GatewayError, ModelNotFoundError
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
from gateway.chat import sse_headers
from gateway.errors import decode_body
from gateway.pipeline import CLIENT_CLOSED, Scope
from gateway.routing_view import completion_output_tokens
from gateway.state import GatewayState
from routers.executor import close_stream
from routers.planner import Plan
from routers.targets import Target

_JSON = "application/json"
_embedding_decoder = msgspec.json.Decoder(EmbeddingRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)


def _state(request: Request[Any, Any, Any]) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


def _cards(request: Request[Any, Any, Any]) -> list[ModelCard]:
    """The aliases the caller may use (401 without credentials when tenants exist)."""
    state = _state(request)
    runtime = state.runtime
    principal = runtime.auth.authenticate(request.headers)
    return [
        ModelCard(alias, state.created, m.owned_by)
        for alias, m in runtime.config.models.items()
        if runtime.auth.may_use(principal, alias)
    ]


@get("/v1/models")
async def list_models(request: Request[Any, Any, Any]) -> Response[bytes]:
    body = encoder.encode(ModelList(_cards(request)))
    return Response(body, media_type=_JSON)


@get("/v1/models/{model_id:path}")
async def get_model(request: Request[Any, Any, Any], model_id: str) -> Response[bytes]:
    model_id = model_id.lstrip("/")
    for card in _cards(request):
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


def _estimate(raw: bytes) -> int:
    """Prompt tokens, roughly (characters / 4), before any tokenizer has seen the body."""
    return len(raw) // 4


async def _run(scope: Scope, model: str, plan: Plan, call: Callable[[Target], Any]) -> Any:
    plan = await scope.wait_for_capacity(plan)
    return await scope.runtime.executor.call(
        model,
        plan.ordered,
        call,
        scope.record.trace,
        observer=scope.observer,
        gate=scope.state.trackers.breakers.gate,
    )


async def _answer(scope: Scope, result: RawResult) -> Response[bytes]:
    scope.record.usage = result.usage
    await scope.close(200)
    return Response(result.body, media_type=_JSON, headers=scope.record.headers())


@post("/v1/embeddings", status_code=200)
async def embeddings(request: Request[Any, Any, Any]) -> Response[bytes]:
    scope = Scope(request, "embeddings")
    try:
        scope.authenticate()
        raw = await scope.read_body(request)
        req = decode_body(_embedding_decoder, raw)
        scope.authorize(req.model)
        plan = scope.plan_other(req.model, EmbeddingProvider, "embeddings", _estimate(raw), 0)
        await scope.admit(plan, _estimate(raw), 0)
        ctx = scope.record.call_context
        result: RawResult = await _run(
            scope,
            req.model,
            plan,
            lambda t: cast(EmbeddingProvider, t.provider).embed(req, ctx(t, raw)),
        )
    except BaseException as exc:
        await scope.close(*scope.fail(exc))
        raise
    return await _answer(scope, result)


@post("/v1/completions", status_code=200)
async def completions(request: Request[Any, Any, Any]) -> Response[Any]:
    scope = Scope(request, "completions")
    record = scope.record
    try:
        scope.authenticate()
        raw = await scope.read_body(request)
        req: CompletionRequest = decode_body(_completion_decoder, raw)
        record.stream = req.stream
        scope.authorize(req.model)
        est = _estimate(raw)
        output = completion_output_tokens(req, scope.runtime.config.routing.max_n)
        plan = scope.plan_other(req.model, CompletionProvider, "completions", est, req.max_tokens)
        await scope.admit(plan, est, output)
        ctx = record.call_context
        if req.stream:
            plan = await scope.wait_for_capacity(plan)
            first, rest = await scope.runtime.executor.open_stream(
                req.model,
                plan.ordered,
                lambda t: cast(CompletionProvider, t.provider).stream_complete(req, ctx(t, raw)),
                record.trace,
                observer=scope.observer,
                gate=scope.state.trackers.breakers.gate,
            )
            scope.hold(rest)
            record.first_byte()
            wants_usage = req.stream_options is not None and req.stream_options.include_usage
            body = _raw_stream(scope, first, rest, wants_usage)
            scope.hold(body)
            return Stream(body, media_type="text/event-stream", headers=sse_headers(record))
        result: RawResult = await _run(
            scope,
            req.model,
            plan,
            lambda t: cast(CompletionProvider, t.provider).complete(req, ctx(t, raw)),
        )
    except BaseException as exc:
        await scope.close(*scope.fail(exc))
        raise
    return await _answer(scope, result)


async def _raw_stream(
    scope: Scope,
    first: RawStreamPart,
    rest: AsyncIterator[RawStreamPart],
    wants_usage: bool,
) -> AsyncIterator[bytes]:
    record = scope.record
    status: int = CLIENT_CLOSED
    error: GatewayError | None = None
    try:
        part: RawStreamPart | None = first
        while part is not None and not scope.client_gone:
            if part.usage is not None:
                record.usage = part.usage
            if part.has_choices or wants_usage:
                yield sse.frame(part.data)
            part = await anext(rest, None)
        if scope.client_gone:
            return  # ends as 499 in ``finally``; closes the upstream
        status = 200
        await close_stream(rest)
        await scope.close(status)
        yield sse.DONE
    except Exception as exc:  # upstream failures and bugs alike end with an error event
        status, error = scope.fail(exc)
        assert error is not None
        yield sse.error_frame(error)
    finally:
        await close_stream(rest)
        await scope.close(status, error)
