"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API
(Claude Code, the ``anthropic`` SDKs) in front of every target kind, translated through the
canonical request; errors in Anthropic's shape on these routes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any

import msgspec
from litestar import Request, Response, post

from core.errors import GatewayError
from core.protocols import CallContext
from core.wire import ChatResult, StreamPart, encoder
from gateway.dialects.anthropic_messages import (
    MessagesIngress,
    StreamEncoder,
    decode_request,
    encode_response,
    error_body,
    error_status,
    message_id,
)
from gateway.http.errors import json_depth_exceeds, too_deep
from gateway.request.chat_flow import CanonicalStreamCodec, serve_chat
from gateway.request.record import RequestRecord
from gateway.request.routing_view import estimate_prompt_tokens
from gateway.request.scope import Scope
from gateway.request.stream import StreamCodec
from routers.targets import Target

PATH = "/v1/messages"


def anthropic_shape(exc: GatewayError, request_id: str | None) -> tuple[int, bytes]:
    """Errors under ``PATH`` (the app's exception handlers pick it by path, so a wrong
    method or an unknown sub-path answers in Anthropic's shape too)."""
    return error_status(exc), error_body(exc, request_id)


@post("/v1/messages", status_code=200)
async def messages(request: Request[Any, Any, Any]) -> Response[Any]:
    return await serve_chat(request, "messages", MessagesAdapter.decode)


@post("/v1/messages/count_tokens", status_code=200)
async def count_tokens(request: Request[Any, Any, Any]) -> Response[bytes]:
    """``{"input_tokens": N}``: the gateway's estimate of the prompt (the same one quotas
    reserve), without calling any upstream; authenticated and authorised like a message."""
    scope = Scope(request, "count_tokens")
    try:
        scope.authenticate()
        ingress = MessagesAdapter.decode(_with_max_tokens(await scope.read_body(request)))
        scope.authorize(ingress.chat.model)
        tokens = estimate_prompt_tokens(ingress.chat)
    except BaseException as exc:
        await scope.close(*scope.fail(exc))
        raise
    await scope.close(200)  # never admitted: no quota, no ledger row; one log line
    body = msgspec.json.encode({"input_tokens": tokens})
    return Response(body, media_type="application/json", headers=scope.record.headers())


_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])


def _with_max_tokens(raw: bytes) -> bytes:
    """A count_tokens body has no ``max_tokens`` (a message must): add one so the same
    decoder reads both. Bodies that are not JSON objects are left for it to refuse."""
    if json_depth_exceeds(raw):
        raise too_deep()
    try:
        fields = _FIELDS.decode(raw)
    except msgspec.DecodeError:
        return raw
    fields.setdefault("max_tokens", msgspec.Raw(b"1"))
    return msgspec.json.encode(fields)


class MessagesAdapter:
    """The Messages dialect around the canonical request."""

    def __init__(self, ingress: MessagesIngress) -> None:
        self.ingress = ingress
        self.chat = ingress.request
        self.upstream_body = encoder.encode(ingress.request)  # OpenAI-compatible targets

    @classmethod
    def decode(cls, raw: bytes) -> MessagesAdapter:
        if json_depth_exceeds(raw):
            raise too_deep()
        return cls(decode_request(raw))

    def body(self, result: ChatResult) -> bytes:
        return encode_response(
            result.response, self.chat.model, include_thinking=self.ingress.wants_thinking
        )

    def codec(self, record: RequestRecord) -> StreamCodec[StreamPart]:
        encoder_ = StreamEncoder(
            self.chat.model,
            message_id(record.request_id),
            include_thinking=self.ingress.wants_thinking,
        )
        return CanonicalStreamCodec(record, encoder_)

    def native_call(self, target: Target, ctx: CallContext) -> Awaitable[ChatResult] | None:
        return None  # every target gets the canonical request

    def native_stream(self, target: Target, ctx: CallContext) -> AsyncIterator[StreamPart] | None:
        return None
