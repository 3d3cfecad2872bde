"""``POST /v1/responses``: OpenAI's Responses API (Codex CLI, the Agents SDK) in front of
every target kind, translated through the canonical request. Stateless: the gateway stores
no responses, so ``previous_response_id`` is a 400 and every answer says ``store: false``."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import msgspec
from litestar import Request, Response, post

from core.errors import InvalidRequestError
from core.protocols import CallContext
from core.wire import ChatResult, StreamPart, encoder
from gateway.dialects.responses import (
    ResponsesIngress,
    StreamEncoder,
    decode_request,
    encode_response,
)
from gateway.request.chat_flow import CanonicalStreamCodec, serve_chat
from gateway.request.record import RequestRecord
from gateway.request.stream import StreamCodec
from routers.targets import Target


@post("/v1/responses", status_code=200)
async def responses(request: Request[Any, Any, Any]) -> Response[Any]:
    return await serve_chat(request, "responses", ResponsesAdapter.decode)


class ResponsesAdapter:
    """The Responses dialect around the canonical request."""

    def __init__(self, ingress: ResponsesIngress) -> None:
        self.ingress = ingress
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
        return cls(msgspec.structs.replace(ingress, store=False))

    def body(self, result: ChatResult) -> bytes:
        return encode_response(result.response, self.ingress, self.response_id, self.created_at)

    def codec(self, record: RequestRecord) -> StreamCodec[StreamPart]:
        encoder_ = StreamEncoder(self.ingress, self.response_id, self.created_at)
        return CanonicalStreamCodec(record, encoder_)

    def native_call(self, target: Target, ctx: CallContext) -> Awaitable[ChatResult] | None:
        return None  # every target gets the canonical request

    def native_stream(self, target: Target, ctx: CallContext) -> AsyncIterator[StreamPart] | None:
        return None
