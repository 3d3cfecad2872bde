"""The edge's handling of clients that leave: cancel the work they no longer wait for, and
end what the handler could not.

Two gaps this ASGI middleware closes:

- Before the response starts, nobody listens for the client: a request waiting for a slow
  upstream, in the admission queue or during fallback would run to its end for a client
  that is gone (and the upstream would bill for it). Once the request body has been read,
  the middleware reads the next ASGI message itself; ``http.disconnect`` before the
  response started cancels the handler's task, which then ends as 499 at whatever await
  it was (the pipeline's closing work survives cancellation). Later ``receive`` calls
  (Litestar's stream listener) get the same message.
- Litestar streams a body by iterating it inside a task group that a disconnect cancels.
  When that lands while the body is suspended at a ``yield`` (waiting for ``send``),
  ``async for`` does not close the generator, so its cleanup (close the upstream, settle
  the quota, commit the ledger row) would wait for garbage collection; a body that never
  started never runs its cleanup. After the application returned or raised, outside any
  cancelled scope, the middleware calls the request's ``Scope.abandon``, which closes what
  is still open and ends the request as 499 if nothing else ended it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Send
from litestar.types import Scope as ASGIScope

# Where a request's pipeline scope registers itself in the ASGI scope's state: an object
# with ``client_gone`` (set here) and ``async abandon()`` (called here at the end).
SCOPE_KEY = "switchyard.scope"


# A request's body is read; if it has not finished this long after, start listening for a
# disconnect. Quick requests (most of them, and every benchmark) then never pay for the
# listening task; a client leaving within this time is noticed this much later.
WATCH_AFTER_S = 0.05


class _Exchange:
    """One HTTP exchange as the middleware sees it."""

    def __init__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        self._scope = scope
        self._receive = receive
        self._send = send
        self._task = asyncio.current_task()
        self._body_read = False
        self._timer: asyncio.TimerHandle | None = None
        self._watcher: asyncio.Future[ReceiveMessage] | None = None
        self.started = False  # the response's first message was sent
        self.finished = False  # the application returned or raised
        self.cancelled_by_us = False

    async def receive(self) -> ReceiveMessage:
        if self._body_read:  # the next message can only be the disconnect
            return await asyncio.shield(self._watch())
        message = await self._receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            self._body_read = True
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(WATCH_AFTER_S, self._watch)
        return message

    async def send(self, message: Message) -> None:
        self.started = True
        await self._send(message)

    def _watch(self) -> asyncio.Future[ReceiveMessage]:
        """The task reading the next ASGI message (started once, when first needed)."""
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(self._receive())
            self._watcher.add_done_callback(self._on_message)
        return self._watcher

    def _on_message(self, watcher: asyncio.Future[ReceiveMessage]) -> None:
        if watcher.cancelled() or watcher.exception() is not None:
            return
        gone = watcher.result()["type"] == "http.disconnect"
        request_scope = _request_scope(self._scope)
        if gone and request_scope is not None:
            request_scope.client_gone = True
        if gone and not self.started and not self.finished and self._task is not None:
            self.cancelled_by_us = True
            self._task.cancel()

    def stop_watching(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()


def finish_abandoned(app: ASGIApp) -> ASGIApp:
    """Wrap ``app``: cancel a request whose client left before its response started, and
    close every request's pipeline scope when the application is done with it."""

    async def middleware(scope: ASGIScope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        exchange = _Exchange(scope, receive, send)
        try:
            await app(scope, exchange.receive, exchange.send)
        except asyncio.CancelledError:
            if not exchange.cancelled_by_us:
                raise  # the server's own cancellation (shutdown) goes on
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # ours: the client is gone, nothing more to answer
        finally:
            exchange.finished = True
            exchange.stop_watching()
            await _abandon(scope)

    return middleware


def _request_scope(scope: ASGIScope) -> Any:
    """The pipeline's ``Scope`` of this request, if its handler made one."""
    state: Any = scope.get("state")
    return state.get(SCOPE_KEY) if isinstance(state, dict) else None


async def _abandon(scope: ASGIScope) -> None:
    request_scope = _request_scope(scope)
    if request_scope is not None:
        await request_scope.abandon()
