"""The JAX worker's HTTP API: the subset of vLLM's OpenAI server the gateway and its tools use.

Routes: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (streaming or not),
``GET /v1/models``, ``GET /health`` (200 only when the model answered its probe),
``POST /tokenize``, ``POST /detokenize``, ``GET /metrics`` (vLLM's metric names).
Chat and completion bodies may carry vLLM's extensions (``local_tier.vllm_extensions``:
``priority``, ``ignore_eos``, ``min_tokens``, ``stop_token_ids``, ``repetition_penalty``,
``skip_special_tokens``, ``include_stop_str_in_output``).
Errors are OpenAI's ``{"error": {...}}`` with vLLM's statuses (unknown model 404, too long or
otherwise invalid 400, full queue 429 with ``Retry-After``, still loading 503). A client that
disconnects, mid-stream or while waiting for a whole answer, aborts its engine sequence.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import msgspec
from litestar import Litestar, MediaType, Request, Response, get, post
from litestar.datastructures import State
from litestar.response import Stream
from prometheus_client import CONTENT_TYPE_LATEST

from core.errors import GatewayError, InvalidRequestError
from core.wire import ChatRequest, CompletionRequest, ErrorBody, ErrorDetail
from local_tier import iterators, serving
from local_tier.vllm_extensions import decode_body, vllm_extensions
from local_tier.worker.protocol import (
    DetokenizeRequest,
    TokenizeRequest,
    model_list,
    tokenize_response,
)
from local_tier.worker.state import WorkerState

T = TypeVar("T")
AnyRequest = Request[Any, Any, Any]
_encode = msgspec.json.Encoder().encode
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientDisconnectedError(Exception):
    """The client went away before its answer was ready."""


def _state(request: AnyRequest) -> WorkerState:
    state: WorkerState = request.app.state.worker
    return state


def _json(payload: object, status: int = 200) -> Response[bytes]:
    return Response(_encode(payload), status_code=status, media_type=MediaType.JSON)


def error_payload(exc: GatewayError) -> ErrorBody:
    return ErrorBody(ErrorDetail(exc.message, exc.type, exc.param, exc.code))


def render_error(_: AnyRequest, exc: Exception) -> Response[bytes]:
    """Any ``GatewayError`` as OpenAI's error body, with ``Retry-After`` when it has one."""
    assert isinstance(exc, GatewayError)
    response = _json(error_payload(exc), exc.status)
    if exc.retry_after is not None:
        response.headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    return response


async def sse(items: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``data:`` events, then ``[DONE]``. An error after the stream started becomes an error
    event (the status line is long gone), as vLLM does."""
    async with iterators.owned(items):
        try:
            async for data in items:
                yield b"data: " + data + b"\n\n"
        except GatewayError as exc:
            yield b"data: " + _encode(error_payload(exc)) + b"\n\n"
        yield b"data: [DONE]\n\n"


async def _encoded(chunks: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    async with iterators.owned(chunks):
        async for chunk in chunks:
            yield _encode(chunk)


async def _raw(parts: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    async with iterators.owned(parts):
        async for part in parts:
            yield part.data


async def until_disconnect(request: AnyRequest, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client disconnects first; then cancel it (which aborts the
    engine sequence) and raise ``ClientDisconnectedError``."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnectedError
    return task.result()


async def _disconnected(request: AnyRequest) -> None:
    # The body was read already, so the next ASGI message can only be the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: AnyRequest) -> Response[Any]:
    started = time.monotonic()
    state = _state(request)
    body = await request.body()
    req = decode_body(body, ChatRequest)
    engine = state.engine_for(req.model)
    meta = serving.new_meta("chatcmpl", state.model_name)
    extensions = vllm_extensions(body)
    generation = serving.chat_generation(engine, req, meta.id, extensions)
    outputs = await until_disconnect(request, state.submit(engine, generation, started))
    if req.stream:
        chunks = serving.chat_chunks(outputs, meta, req.wants_usage_in_stream())
        return Stream(sse(_encoded(chunks)), media_type="text/event-stream", headers=_SSE_HEADERS)
    answer = await until_disconnect(request, serving.collect(outputs))
    return _json(serving.chat_response(meta, answer))


@post("/v1/completions", status_code=200)
async def completions(request: AnyRequest) -> Response[Any]:
    started = time.monotonic()
    state = _state(request)
    body = await request.body()
    req = decode_body(body, CompletionRequest)
    engine = state.engine_for(req.model)
    meta = serving.new_meta("cmpl", state.model_name)
    extensions = vllm_extensions(body)
    generation = serving.completion_generation(engine, req, meta.id, extensions)
    outputs = await until_disconnect(request, state.submit(engine, generation, started))
    if req.stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        parts = serving.completion_stream(outputs, meta, usage)
        return Stream(sse(_raw(parts)), media_type="text/event-stream", headers=_SSE_HEADERS)
    answer = await until_disconnect(request, serving.collect(outputs))
    body, _ = serving.completion_body(meta, answer)
    return Response(body, media_type=MediaType.JSON)


@get("/v1/models")
async def models(request: AnyRequest) -> Response[bytes]:
    state = _state(request)
    max_len = state.engine.max_model_len if state.engine else state.config.max_model_len
    return _json(model_list(state.model_name, state.config.model_path, max_len))


@get("/health")
async def health(request: AnyRequest) -> Response[bytes]:
    return Response(b"", status_code=200 if _state(request).ready else 503)


@post("/tokenize", status_code=200)
async def tokenize(request: AnyRequest) -> Response[bytes]:
    state = _state(request)
    req = decode_body(await request.body(), TokenizeRequest)
    engine = state.engine_for(req.model)
    return _json(tokenize_response(engine, req))


@post("/detokenize", status_code=200)
async def detokenize(request: AnyRequest) -> Response[bytes]:
    state = _state(request)
    req = decode_body(await request.body(), DetokenizeRequest)
    engine = state.engine_for(req.model)
    if any(t < 0 for t in req.tokens):
        raise InvalidRequestError("Token ids must be non-negative.", param="tokens")
    return _json({"prompt": engine.tokenizer.decode(req.tokens)})


@get("/metrics")
async def metrics(request: AnyRequest) -> Response[bytes]:
    body = _state(request).metrics.render()
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def disconnected(_: AnyRequest, __: Exception) -> Response[bytes]:
    # Nobody is listening; 499 (nginx's "client closed request") only shows in access logs.
    return Response(b"", status_code=499)


def create_app(state: WorkerState) -> Litestar:
    """The worker app around ``state``; the model starts loading when the app starts."""

    async def startup() -> None:
        state.begin_loading()

    return Litestar(
        route_handlers=[
            chat_completions,
            completions,
            models,
            health,
            tokenize,
            detokenize,
            metrics,
        ],
        on_startup=[startup],
        on_shutdown=[state.shutdown],
        exception_handlers={GatewayError: render_error, ClientDisconnectedError: disconnected},
        state=State({"worker": state}),
        openapi_config=None,
    )
