"""The one SSE body every streamed answer uses, whatever the endpoint or client dialect.

A ``StreamCodec`` turns the upstream's parts into the client's events and does nothing else:
the body first keeps what the record needs of each part (``keep_chunk`` or ``keep_raw``: the
text sent so far, the usage), then has the codec encode it. The body owns the request's
end: the first part was already received (the executor falls back until one comes), so from
here a failure becomes the dialect's error event and a clean close; the quota is settled and
the ledger row committed before the last event (``[DONE]``, Anthropic's ``message_stop``...),
and also when the client went away (499) or the body failed (its status). A client that goes
away cancels this generator, or makes it stop at the next part (``Scope.client_gone``), and
the upstream stream is closed either way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from typing import Generic, Protocol, TypeVar

from litestar.response import Stream

from core.errors import GatewayError
from core.wire import RawStreamPart, StreamPart
from gateway.request.scope import CLIENT_CLOSED, Scope
from gateway.telemetry.record import RequestRecord
from routers.streams import close_stream

P = TypeVar("P")
P_contra = TypeVar("P_contra", contravariant=True)


class StreamCodec(Protocol[P_contra]):
    """How one dialect writes a stream. ``frame`` sees every part in order, after the body
    kept what the record needs from it (``Keep``); each method returns the bytes to send
    (``b""``: none)."""

    def start(self) -> bytes: ...

    def frame(self, part: P_contra) -> bytes: ...

    def end(self) -> bytes:
        """After the scope closed with 200: the events that end a complete stream."""
        ...

    def error(self, exc: GatewayError) -> bytes: ...


Keep = Callable[[RequestRecord, P], None]
"""What the record keeps of one part, whichever codec writes it."""


def keep_chunk(record: RequestRecord, part: StreamPart) -> None:
    """A canonical chunk (translated or passed through): count the text it sends (what a
    cut stream bills when no usage came) and keep the usage it carries."""
    chunk = part.chunk
    record.streamed(chunk)
    if record.capture_content:
        record.capture_answer(chunk)
    if chunk.usage is not None:
        record.usage = chunk.usage


def keep_raw(record: RequestRecord, part: RawStreamPart) -> None:
    """A legacy completions event, forwarded unread: only the usage it reports is kept (its
    text is not counted, so a cut completions stream is not estimated)."""
    if part.usage is not None:
        record.usage = part.usage


def encode_all(
    record: RequestRecord, parts: Iterable[P], codec: StreamCodec[P], keep: Keep[P]
) -> list[bytes]:
    """Every event of a stream known in full (a cache hit), kept part by part as a live
    stream is: the non-empty frames of ``start``, each part and ``end``."""
    frames = [codec.start()]
    for part in parts:
        keep(record, part)
        frames.append(codec.frame(part))
    frames.append(codec.end())
    return [f for f in frames if f]


def sse_headers(record: RequestRecord) -> dict[str, str]:
    return {**record.headers(), "cache-control": "no-cache", "x-accel-buffering": "no"}


def sse_response(
    scope: Scope, first: P, rest: AsyncIterator[P], codec: StreamCodec[P], keep: Keep[P]
) -> Stream:
    """The streamed response for an opened upstream stream (``first`` and ``rest``): ``keep``
    records what each part says, then ``codec`` encodes it."""
    scope.hold(rest)
    scope.record.first_byte()
    body = _Body(scope, first, rest, codec, keep).run()
    scope.hold(body)  # closed by the edge if the server never runs it to its end
    return Stream(body, media_type="text/event-stream", headers=sse_headers(scope.record))


class _Body(Generic[P]):
    def __init__(
        self,
        scope: Scope,
        first: P,
        rest: AsyncIterator[P],
        codec: StreamCodec[P],
        keep: Keep[P],
    ) -> None:
        self.scope = scope
        self.first = first
        self.rest = rest
        self.codec = codec
        self.keep = keep

    def frame(self, part: P) -> bytes:
        """The record keeps what it needs of ``part``, then the codec encodes it."""
        self.keep(self.scope.record, part)
        return self.codec.frame(part)

    async def run(self) -> AsyncIterator[bytes]:
        scope, codec, rest = self.scope, self.codec, self.rest
        status: int = CLIENT_CLOSED
        error: GatewayError | None = None
        try:
            for framed in (codec.start(), self.frame(self.first)):
                if framed:
                    yield framed
            async for part in rest:
                if scope.client_gone:
                    return  # ends as 499 in ``finally``; closes the upstream
                framed = self.frame(part)
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
