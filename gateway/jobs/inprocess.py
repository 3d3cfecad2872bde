"""One batch item through the gateway's own ASGI app, in process.

The item's body is POSTed to its endpoint by calling the app directly with an ASGI scope
built here: the request takes the same path as one from the network (middleware, routes,
``Scope``: routing, fallback, quotas, the admission queue, the ledger row, metrics), with
no socket and no credential. Who it runs for travels in the scope's state
(``gateway.request.batch``); the item's ``custom_id`` is sent as ``x-request-id`` when it
is a safe token, so the ledger row carries it as ``client_request_id``.

The ``receive`` channel gives the body once and then reports a disconnect only after the
response is complete, so the edge middleware never takes the runner for a client that
left; cancelling the call (a runner that stops) cancels the request like a disconnect.
"""

from __future__ import annotations

import asyncio
import math
from typing import NamedTuple, cast

from litestar.types import ASGIApp, HTTPScope, Message

from gateway.http.channel import body_then_disconnect
from gateway.request.batch import BATCH_KEY, BatchCaller
from gateway.telemetry.record import GATEWAY_ID_HEADER, SAFE_ID
from policies.jobs.objects import new_id

_INTERNAL = (
    b'{"error": {"message": "The gateway failed to run this request.",'
    b' "type": "server_error", "param": null, "code": null}}'
)


class Answer(NamedTuple):
    """What the app answered: status, headers (lower-case names), body."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def request_id(self) -> str:
        """The gateway's id for the request (its ledger row's key)."""
        return (
            self.headers.get(GATEWAY_ID_HEADER)
            or self.headers.get("x-request-id")
            or new_id("req_")
        )

    def retry_after_s(self) -> float | None:
        value = self.headers.get("retry-after")
        try:
            seconds = float(value) if value is not None else None
        except ValueError:
            return None
        return seconds if seconds is not None and math.isfinite(seconds) else None


def internal_failure() -> Answer:
    """The answer recorded when the app itself raised (a bug, logged by the caller)."""
    return Answer(500, {}, _INTERNAL)


def _scope(url: str, body: bytes, caller: BatchCaller, custom_id: str) -> HTTPScope:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"user-agent", b"switchyard-batch"),
    ]
    if SAFE_ID.match(custom_id):
        headers.append((b"x-request-id", custom_id.encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": url,
        "raw_path": url.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": None,
        "server": None,
        "state": {BATCH_KEY: caller},
    }
    return cast(HTTPScope, scope)


async def call_app(
    app: ASGIApp, url: str, body: bytes, caller: BatchCaller, custom_id: str
) -> Answer:
    """POST ``body`` to ``url`` on ``app`` as ``caller``; the whole answer."""
    complete = asyncio.Event()
    status, headers, chunks = 500, {}, []

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = message["status"]
            raw = message.get("headers", ())
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw}
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                complete.set()

    try:
        await app(_scope(url, body, caller, custom_id), body_then_disconnect(body, complete), send)
    finally:
        complete.set()  # a receive still waiting (the edge's listener) ends too
    return Answer(status, headers, b"".join(chunks))
