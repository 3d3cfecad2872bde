"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API
(Claude Code, the ``anthropic`` SDKs) in front of every target kind; errors in Anthropic's
shape on these routes.

Anthropic targets get the client's body passed through (``providers.anthropic.passthrough``:
only ``model`` replaced, unsigned thinking blocks dropped, the client's ``anthropic-beta``
forwarded) and their answer's bytes forwarded back; other targets get the canonical request
and their answer is translated. Either way the answer's ``model`` is the alias the client
asked for (in the JSON and in ``message_start``): the client sees one model whichever target
served it, also after a fallback between an Anthropic and another target. The upstream's own
name is in the ``x-switchyard-upstream-model`` header."""

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
from gateway.request.routing_view import estimate_prompt_tokens
from gateway.request.scope import Scope
from gateway.request.stream import StreamCodec
from gateway.telemetry.record import RequestRecord
from providers.anthropic import AnthropicProvider, passthrough
from routers.targets import Target

PATH = "/v1/messages"


def anthropic_shape(exc: GatewayError, request_id: str | None) -> tuple[int, bytes]:
    """Errors under ``PATH`` (the app's exception handlers pick it by path, so a wrong
    method or an unknown sub-path answers in Anthropic's shape too)."""
    return error_status(exc), error_body(exc, request_id)


@post("/v1/messages", status_code=200)
async def messages(request: Request[Any, Any, Any]) -> Response[Any]:
    beta = request.headers.get(passthrough.BETA)
    return await serve_chat(request, "messages", lambda raw: MessagesAdapter.decode(raw, beta))


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
    """The Messages dialect around the canonical request, with the client's body passed
    through to Anthropic targets. ``beta`` is the client's ``anthropic-beta`` header, which
    only those targets get (the canonical call has no headers from the client)."""

    def __init__(self, ingress: MessagesIngress, beta: str | None = None) -> None:
        self.ingress = ingress
        self.chat = ingress.request
        self.upstream_body = encoder.encode(ingress.request)  # OpenAI-compatible targets
        self.beta = beta
        self._native: ChatResult | None = None  # the answer of a passthrough call, if any

    @classmethod
    def decode(cls, raw: bytes, beta: str | None = None) -> MessagesAdapter:
        if json_depth_exceeds(raw):
            raise too_deep()
        return cls(decode_request(raw), beta)

    def body(self, result: ChatResult) -> bytes:
        """Anthropic's own JSON (``model`` set to the alias) when an Anthropic target answered
        the passed-through body, else the canonical answer translated."""
        if result is self._native and result.raw is not None:
            return passthrough.with_model(result.raw, self.chat.model)
        return encode_response(
            result.response, self.chat.model, include_thinking=self.ingress.wants_thinking
        )

    def codec(self, record: RequestRecord) -> StreamCodec[StreamPart]:
        """Anthropic's events forwarded when an Anthropic target serves the stream, else the
        canonical chunks encoded as Anthropic's events."""
        encoder_ = StreamEncoder(
            self.chat.model,
            message_id(record.request_id),
            include_thinking=self.ingress.wants_thinking,
        )
        served = record.trace.served_by
        if served is not None and _anthropic(served) is not None:
            return PassthroughCodec(encoder_, self.chat.model)
        return CanonicalStreamCodec(record, encoder_)

    def native_call(self, target: Target, ctx: CallContext) -> Awaitable[ChatResult] | None:
        provider = _anthropic(target)
        if provider is None:
            return None
        return self._remember(passthrough.call(provider, self.ingress.raw, ctx, self.beta))

    def native_stream(self, target: Target, ctx: CallContext) -> AsyncIterator[StreamPart] | None:
        provider = _anthropic(target)
        if provider is None:
            return None
        return passthrough.stream(provider, self.ingress.raw, ctx, self.beta)

    async def _remember(self, call: Awaitable[ChatResult]) -> ChatResult:
        # Only the result of the call that succeeded is kept: after a fallback from an
        # Anthropic target to another one, ``body`` sees a result that is not this one.
        self._native = await call
        return self._native


def _anthropic(target: Target) -> AnthropicProvider | None:
    """The target's provider when it speaks the Messages API itself."""
    provider = target.provider
    return provider if isinstance(provider, AnthropicProvider) else None


class PassthroughCodec:
    """Forwards an Anthropic target's events as they came (``message_start`` names the
    alias; the body keeps the text and usage their chunks carry). ``message_stop`` is held
    back for ``end``: the ledger row is committed before the last event, as for every
    stream, so a client that hangs up on it is not counted as gone. A failure after the
    stream started ends it with Anthropic's ``error`` event."""

    def __init__(self, encoder_: StreamEncoder, model: str) -> None:
        self.encoder = encoder_
        self.model = model
        self.last = b""

    def start(self) -> bytes:
        return b""  # Anthropic's own message_start comes as the first part

    def frame(self, part: StreamPart) -> bytes:
        if part.raw is None:  # only passthrough parts reach this codec; nothing to forward
            return b""
        if part.raw.startswith(_MESSAGE_STOP):
            self.last = part.raw
            return b""
        return passthrough.event_with_model(part.raw, self.model)

    def end(self) -> bytes:
        return self.last

    def error(self, exc: GatewayError) -> bytes:
        return self.encoder.error(exc)


_MESSAGE_STOP = b"event: message_stop\n"
