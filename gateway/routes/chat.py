"""``POST /v1/chat/completions``: OpenAI's Chat Completions, the canonical dialect (the
client's body is forwarded to OpenAI-compatible upstreams, their bytes answered as they are)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any

import msgspec
from litestar import Request, Response, post

from core.errors import GatewayError
from core.protocols import CallContext
from core.wire import ChatRequest, ChatResult, StreamPart, encoder
from gateway.http import sse
from gateway.http.errors import decode_body
from gateway.request.chat_flow import serve_chat
from gateway.telemetry.record import RequestRecord
from routers.targets import Target

_decoder = msgspec.json.Decoder(ChatRequest)


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:
    return await serve_chat(request, "chat", ChatIngress.decode)


class ChatIngress:
    """A Chat Completions request: decoded for routing, forwarded as the client wrote it."""

    def __init__(self, chat: ChatRequest, raw: bytes) -> None:
        self.chat = chat
        self.upstream_body = raw

    @classmethod
    def decode(cls, raw: bytes) -> ChatIngress:
        return cls(decode_body(_decoder, raw), raw)

    def body(self, result: ChatResult) -> bytes:
        return result.raw if result.raw is not None else encoder.encode(result.response)

    def codec(self, record: RequestRecord) -> ChatStreamCodec:
        return ChatStreamCodec(self.chat.wants_usage_in_stream())

    def native_call(self, target: Target, ctx: CallContext) -> Awaitable[ChatResult] | None:
        return None  # every target gets the canonical request

    def native_stream(self, target: Target, ctx: CallContext) -> AsyncIterator[StreamPart] | None:
        return None


class ChatStreamCodec:
    """OpenAI's chat SSE: each chunk as ``data: <json>`` (the upstream's own bytes when it
    sent them), ``data: [DONE]`` at the end. The usage-only chunk (the gateway always asks
    for it, for its accounting; the body has kept its usage) reaches the client only when it
    asked."""

    def __init__(self, wants_usage: bool) -> None:
        self.wants_usage = wants_usage

    def start(self) -> bytes:
        return b""

    def frame(self, part: StreamPart) -> bytes:
        chunk = part.chunk
        if chunk.usage is not None and not chunk.choices and not self.wants_usage:
            return b""
        return sse.frame(part.raw if part.raw is not None else encoder.encode(chunk))

    def end(self) -> bytes:
        return sse.DONE

    def error(self, exc: GatewayError) -> bytes:
        return sse.error_frame(exc)
