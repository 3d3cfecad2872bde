"""The one SSE body every streamed answer uses, whatever the endpoint or client dialect.

A ``StreamCodec`` turns the upstream's parts into the client's events; ``sse_body`` owns the
request's end: the first part was already received (the executor falls back until one
comes), so from here a failure becomes the dialect's error event and a clean close; the
quota is settled and the ledger row committed before the last event (``[DONE]``, Anthropic's
``message_stop``...), and also when the client went away (499) or the body failed (its
status). A client that goes away cancels this generator, or makes it stop at the next part
(``Scope.client_gone``), and the upstream stream is closed either way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Generic, Protocol, TypeVar

from litestar.response import Stream

from core.errors import GatewayError
from gateway.request.record import RequestRecord
from gateway.request.scope import CLIENT_CLOSED, Scope
from routers.executor import close_stream

P = TypeVar("P")
P_contra = TypeVar("P_contra", contravariant=True)


class StreamCodec(Protocol[P_contra]):
    """How one dialect writes a stream. ``frame`` sees every part in order (and keeps what
    the record needs, e.g. usage); each method returns the bytes to send (``b""``: none)."""

    def start(self) -> bytes: ...

    def frame(self, part: P_contra) -> bytes: ...

    def end(self) -> bytes:
        """After the scope closed with 200: the events that end a complete stream."""
        ...

    def error(self, exc: GatewayError) -> bytes: ...


def sse_headers(record: RequestRecord) -> dict[str, str]:
    return {**record.headers(), "cache-control": "no-cache", "x-accel-buffering": "no"}


def sse_response(scope: Scope, first: P, rest: AsyncIterator[P], codec: StreamCodec[P]) -> Stream:
    """The streamed response for an opened upstream stream (``first`` and ``rest``)."""
    scope.hold(rest)
    scope.record.first_byte()
    body = _Body(scope, first, rest, codec).run()
    scope.hold(body)  # closed by the edge if the server never runs it to its end
    return Stream(body, media_type="text/event-stream", headers=sse_headers(scope.record))


class _Body(Generic[P]):
    def __init__(
        self, scope: Scope, first: P, rest: AsyncIterator[P], codec: StreamCodec[P]
    ) -> None:
        self.scope = scope
        self.first = first
        self.rest = rest
        self.codec = codec

    async def run(self) -> AsyncIterator[bytes]:
        scope, codec, rest = self.scope, self.codec, self.rest
        status: int = CLIENT_CLOSED
        error: GatewayError | None = None
        try:
            for framed in (codec.start(), codec.frame(self.first)):
                if framed:
                    yield framed
            async for part in rest:
                if scope.client_gone:
                    return  # ends as 499 in ``finally``; closes the upstream
                framed = codec.frame(part)
                if framed:
                    yield framed
            if scope.client_gone:
                return
            status = 200
            await close_stream(rest)
            await scope.close(status)
            yield codec.end()
        except Exception as exc:  # upstream failures and bugs alike end with an error event
            status, error = scope.fail(exc)
            assert error is not None
            yield codec.error(error)
        finally:
            await close_stream(rest)
            await scope.close(status, error)
