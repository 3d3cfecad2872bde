"""How ``switchyard serve`` runs uvicorn, with the connection hygiene uvicorn lacks.

What uvicorn (httptools protocol, checked against 0.54) offers and what it does not:

- ``timeout_keep_alive`` closes a connection idle *between* two requests: used, from
  ``server.keep_alive_timeout_s``. ``backlog``: used.
- ``limit_concurrency`` answers 503 once connections + tasks exceed it, but only when a
  request's headers are complete: idle sockets still pile up without bound, and every
  request (``/healthz`` too) gets 503 while they do. Not used; ``max_connections`` below.
- No deadline before the first request or for a request's headers: a socket that sends
  nothing, or one header line every few seconds (slowloris), is held forever.
- No header size limit: httptools (llhttp) has none, so a 1 MB header is read and served
  (``h11_max_incomplete_event_size`` is for the h11 protocol only).
- No write timeout: when a client stops reading, the transport pauses writing and the ASGI
  ``send`` waits for it to resume, forever, holding the request's quota lease and
  concurrency slot.

Both its timers and uvicorn's keep-alive timer look twice before closing: libuv runs due
timers before it polls sockets again, so a loop stalled past a deadline would otherwise close
connections whose request arrived in time, without an answer.

``GuardedHttpToolsProtocol`` adds the four, by overriding uvicorn's ``HttpToolsProtocol``
callbacks (each calls the original): ``connection_made``, ``connection_lost``,
``data_received``, ``on_message_begin``, ``on_url``, ``on_header``, ``on_headers_complete``,
``on_body``, ``on_message_complete``, ``pause_writing``, ``resume_writing``,
``timeout_keep_alive_handler``; and it reads ``cycle`` (``response_complete``,
``keep_alive``), ``timeout_keep_alive_task``, ``connections``, ``transport``, ``loop`` and
``server_state.default_headers``. These internals have been stable since uvicorn 0.20;
tests/hostile/test_connections.py exercises every one against a real gateway process.
"""

from __future__ import annotations

import contextlib
import http
import resource
from asyncio import TimerHandle, Transport
from collections.abc import Callable
from typing import Any, ClassVar

import structlog
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from core.config import ServerConfig

_log = structlog.get_logger("switchyard.server")
FD_HEADROOM = 512  # descriptors kept for upstream connections, Redis, SQLite, the engine
# After a deadline's timer fires, how long until the verdict: long enough that the
# loop polls its sockets in between (timers are due in whole milliseconds), short enough not
# to matter to the deadline.
HEADER_RECHECK_S = 0.005


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus: a connection cap (``max_connections``), a total
    header deadline (``header_timeout_s``, from the connection's open for its first request
    and from the first byte of each later one), a header size limit (``max_header_bytes``)
    and a write-stall limit (``send_timeout_s``). Subclass it with ``limits`` set (see
    ``protocol_class``); the defaults are ``ServerConfig()``'s."""

    limits: ClassVar[ServerConfig] = ServerConfig()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: TimerHandle | None = None
        self._send_deadline: TimerHandle | None = None
        self._in_headers = False  # between a request's first byte and its headers' end
        self._header_bytes = 0  # request line and headers of the current request, parsed
        self._unparsed_bytes = 0  # bytes received while its headers are still incomplete
        self._refused = False  # answered with an error and closing: ignore what follows
        self._second_look: TimerHandle | None = None  # a deadline's re-check (``_look_again``)

    # --- connection lifetime -----------------------------------------------------------

    def connection_made(self, transport: Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            # Refuse at once rather than hold the socket: the cap bounds descriptors and
            # memory, and the header deadline soon frees the slots idle sockets took.
            self._refuse(503, "Too many open connections.")
            return
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_deadline()
        self._cancel_send_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        if self._refused or self.transport.is_closing():
            return
        if self._in_headers:
            # Bounds memory for headers that span reads; headers that end inside one read
            # are measured exactly in on_headers_complete.
            self._unparsed_bytes += len(data)
            if self._unparsed_bytes > self.limits.max_header_bytes:
                self._refuse(431, "Request header fields too large.")
                return
        if self.cycle is None or self.cycle.response_complete:
            # Bytes that begin no request (blank lines) must not hold the connection open
            # either: the keep-alive timer was cancelled when they arrived.
            self._arm_header_deadline()

    # --- parser callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        self._header_bytes = 0
        self._unparsed_bytes = 0
        self._arm_header_deadline()

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._header_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._header_bytes += len(name) + len(value) + 4  # ": " and CRLF

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._cancel_header_deadline()
        if self._refused:
            return
        if self._header_bytes > self.limits.max_header_bytes:
            self._refuse(431, "Request header fields too large.")
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:  # no request cycle was started for a refused request
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    # --- write flow control ---------------------------------------------------------------

    def pause_writing(self) -> None:
        """The transport's buffer is full (the client is not reading): start the clock."""
        super().pause_writing()
        if self._send_deadline is None:
            self._send_deadline = self.loop.call_later(
                self.limits.send_timeout_s, self._send_timed_out
            )

    def resume_writing(self) -> None:
        super().resume_writing()
        self._cancel_send_deadline()

    def _send_timed_out(self) -> None:
        """Abort, not close: close would wait for a flush that never comes. Losing the
        connection marks the request disconnected, which wakes the blocked ``send`` and
        makes ``receive`` return ``http.disconnect``: the app ends the request as a client
        disconnect (its cleanup releases what admission took)."""
        self._send_deadline = None
        client = f"{self.client[0]}:{self.client[1]}" if self.client else None
        _log.warning("connection.send_timeout", client=client, after_s=self.limits.send_timeout_s)
        self.transport.abort()

    def timeout_keep_alive_handler(self) -> None:
        """uvicorn's keep-alive timeout, judged after a second look (``_look_again``)."""
        again = self._look_again(self.timeout_keep_alive_task, self.timeout_keep_alive_handler)
        if again is not None:
            self.timeout_keep_alive_task = again  # uvicorn cancels it when bytes arrive
            return
        super().timeout_keep_alive_handler()

    def _look_again(
        self, fired: TimerHandle | None, verdict: Callable[[], None]
    ) -> TimerHandle | None:
        """A deadline's timer ``fired``: unless it was already the second look, schedule
        ``verdict`` again ``HEADER_RECHECK_S`` later and return that timer (None: judge
        now). libuv runs due timers before it polls sockets again, so a loop stalled past
        the deadline (a long callback, a GC pause, a busy machine) would otherwise judge the
        client before reading bytes that arrived in time."""
        if fired is not None and fired is self._second_look:
            return None
        self._second_look = self.loop.call_later(HEADER_RECHECK_S, verdict)
        return self._second_look

    def _cancel_send_deadline(self) -> None:
        if self._send_deadline is not None:
            self._send_deadline.cancel()
            self._send_deadline = None

    # --- the header deadline --------------------------------------------------------------

    def _arm_header_deadline(self) -> None:
        """Start the clock unless it runs already: the deadline is total, not per read."""
        if self._header_deadline is None and not self._refused:
            self._header_deadline = self.loop.call_later(
                self.limits.header_timeout_s, self._header_timed_out
            )

    def _cancel_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _header_timed_out(self) -> None:
        """The deadline passed: judged after a second look (``_look_again``), on what the
        loop has read by then."""
        fired, self._header_deadline = self._header_deadline, None
        if self.transport.is_closing():
            return
        again = self._look_again(fired, self._header_timed_out)
        if again is not None:
            self._header_deadline = again  # cancelled when the headers complete
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A slow pipelined request behind a response in flight: let that response
            # finish, then close (as uvicorn's own graceful shutdown does).
            self.cycle.keep_alive = False
        elif self._in_headers:
            self._refuse(408, "Request header timeout.")
        else:
            self.transport.close()  # nothing (or only blank lines) arrived: no answer owed

    def _refuse(self, status: int, message: str) -> None:
        """Answer with ``status`` and close; nothing else is read from this connection."""
        self._refused = True
        self._cancel_header_deadline()
        body = message.encode()
        lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n".encode()]
        defaults = self.server_state.default_headers  # date and server, as uvicorn sends
        lines += [name + b": " + value + b"\r\n" for name, value in defaults]
        lines += [
            b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        ]
        self.transport.write(b"".join(lines))
        self.transport.close()


def protocol_class(limits: ServerConfig) -> type[GuardedHttpToolsProtocol]:
    """``GuardedHttpToolsProtocol`` bound to ``limits`` (uvicorn instantiates the class)."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})


def ensure_descriptors(limits: ServerConfig) -> None:
    """Raise the soft open-files limit toward the hard one so that ``max_connections`` can
    be reached (many systems start at 1024); warn when the hard limit is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = limits.max_connections + FD_HEADROOM
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < wanted:
            _log.warning(
                "server.open_files_limit", limit=target, max_connections=limits.max_connections
            )


def uvicorn_config(app: Any, limits: ServerConfig, host: str, port: int) -> uvicorn.Config:
    """The uvicorn settings of ``switchyard serve``: uvloop, httptools with the guards above,
    no access log (the app writes one line per request)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http=protocol_class(limits),
        backlog=limits.backlog,
        # uvicorn types it int, but only hands it to loop.call_later: a float is fine.
        timeout_keep_alive=limits.keep_alive_timeout_s,  # type: ignore[arg-type]
        timeout_graceful_shutdown=max(30, int(limits.drain_timeout_s) + 1),
    )


def run(app: Any, limits: ServerConfig, host: str, port: int) -> bool:
    """Serve ``app`` until a shutdown signal; False if the server could not start (e.g. the
    port is taken)."""
    ensure_descriptors(limits)
    server = uvicorn.Server(uvicorn_config(app, limits, host, port))
    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: Ctrl-C twice ends at once
        server.run()
    return server.started
