"""``POST /v1/responses``: OpenAI's Responses API (Codex CLI, the Agents SDK) in front of
every target kind. Stateless: the gateway stores no responses, so ``previous_response_id``
is a 400 and every answer says ``store: false``.

Targets whose OpenAI adapter serves the Responses API (``responses_api``) get the client's
body passed through (``model`` replaced, ``store`` false) and their answer is forwarded as
it came, like the chat route forwards upstream bytes: the upstream's own ``id`` and
``model`` (not the alias) included. Every other target gets the canonical request, and
the answer is translated back. Fallback may switch between the two mid-plan. The response
cache keeps the canonical reading of either answer, so a cache hit is always translated."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import msgspec
from litestar import Request, Response, post

from core.errors import GatewayError, InvalidRequestError
from core.protocols import CallContext
from core.wire import ChatResult, StreamPart, encoder
from gateway.dialects.responses import (
    ResponsesIngress,
    StreamEncoder,
    decode_request,
    encode_response,
)
from gateway.dialects.responses_wire import ResponseError, response_object, response_usage
from gateway.request.chat_flow import CanonicalStreamCodec, serve_chat
from gateway.request.stream import StreamCodec
from gateway.telemetry.record import RequestRecord
from providers.openai import OpenAIProvider
from routers.targets import Target

_ENCODER = msgspec.json.Encoder()


@post("/v1/responses", status_code=200)
async def responses(request: Request[Any, Any, Any]) -> Response[Any]:
    return await serve_chat(request, "responses", ResponsesAdapter.decode)


class ResponsesAdapter:
    """The Responses dialect around the canonical request."""

    def __init__(self, ingress: ResponsesIngress, raw: bytes = b"") -> None:
        self.ingress = ingress
        self.raw = raw  # the client's body, for targets that take it as it is
        self.native: ChatResult | None = None  # the answer of a passthrough call, if one
        self.chat = ingress.chat
        self.upstream_body = encoder.encode(ingress.chat)  # OpenAI-compatible targets
        self.response_id = "resp_" + os.urandom(12).hex()
        self.created_at = int(time.time())

    @classmethod
    def decode(cls, raw: bytes) -> ResponsesAdapter:
        ingress = decode_request(raw)
        if ingress.previous_response_id is not None:
            raise InvalidRequestError(
                "This gateway stores no responses, so 'previous_response_id' cannot be "
                "resolved: send the whole conversation in 'input' (as with store: false).",
                param="previous_response_id",
                code="unsupported_parameter",
            )
        return cls(msgspec.structs.replace(ingress, store=False), raw)

    def body(self, result: ChatResult) -> bytes:
        """The upstream's bytes when a passthrough call answered, else the translation."""
        if result is self.native and result.raw is not None:
            return result.raw
        return encode_response(result.response, self.ingress, self.response_id, self.created_at)

    def codec(self, record: RequestRecord) -> StreamCodec[StreamPart]:
        served = record.trace.served_by
        if served is not None and _passthrough(served) is not None:
            return PassthroughCodec(record, self.ingress)
        encoder_ = StreamEncoder(self.ingress, self.response_id, self.created_at)
        return CanonicalStreamCodec(record, encoder_)

    def native_call(self, target: Target, ctx: CallContext) -> Awaitable[ChatResult] | None:
        provider = _passthrough(target)
        if provider is None:
            return None
        return self._call(provider, self._client_body(ctx))

    def native_stream(self, target: Target, ctx: CallContext) -> AsyncIterator[StreamPart] | None:
        provider = _passthrough(target)
        if provider is None:
            return None
        return provider.stream_responses(self._client_body(ctx))

    async def _call(self, provider: OpenAIProvider, ctx: CallContext) -> ChatResult:
        result = await provider.responses(ctx)
        self.native = result  # so that ``body`` knows these bytes are already Responses
        return result

    def _client_body(self, ctx: CallContext) -> CallContext:
        # the pipeline's ctx carries the canonical request's JSON; these targets get ours
        return msgspec.structs.replace(ctx, raw_body=self.raw)


def _passthrough(target: Target) -> OpenAIProvider | None:
    """The target's adapter when it speaks the Responses API, else None."""
    provider = target.provider
    if isinstance(provider, OpenAIProvider) and provider.responses_api:
        return provider
    return None


class PassthroughCodec:
    """Forwards an upstream Responses stream event by event as received (the body keeps the
    text and usage of their chunks). A mid-stream failure ends it with the dialect's
    ``error`` and ``response.failed`` events, numbered after the upstream's last event,
    naming the upstream's response id and the usage the record kept."""

    def __init__(self, record: RequestRecord, ingress: ResponsesIngress) -> None:
        self.record = record
        self.ingress = ingress
        self.sent = 0  # events forwarded: the next sequence_number
        self.response_id = ""
        self.created_at = int(time.time())

    def start(self) -> bytes:
        return b""

    def frame(self, part: StreamPart) -> bytes:
        chunk = part.chunk
        self.response_id = chunk.id or self.response_id
        self.created_at = chunk.created or self.created_at
        self.sent += 1
        return part.raw or b""

    def end(self) -> bytes:
        return b""  # the upstream's terminal event was the last part

    def error(self, exc: GatewayError) -> bytes:
        error = {
            "type": "error",
            "sequence_number": self.sent,
            "code": exc.code or exc.type,
            "message": exc.message,
            "param": exc.param,
        }
        code = "rate_limit_exceeded" if exc.status == 429 else "server_error"
        failed = response_object(
            self.ingress,
            self.response_id,
            self.created_at,
            status="failed",
            output=[],
            usage=response_usage(self.record.usage),
            error=ResponseError(code, exc.message),
        )
        end = {"type": "response.failed", "sequence_number": self.sent + 1, "response": failed}
        return _event("error", error) + _event("response.failed", end)


def _event(kind: str, payload: object) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + _ENCODER.encode(payload) + b"\n\n"
