"""A ``receive`` channel for requests the gateway runs on behalf of someone who is not
listening on the connection (an idempotent run whose client may leave, a batch item)."""

from __future__ import annotations

import asyncio

from litestar.types import Receive, ReceiveMessage


def body_then_disconnect(body: bytes, answered: asyncio.Event) -> Receive:
    """The whole ``body`` once, then ``http.disconnect`` only when ``answered`` is set (the
    response was sent), as a server reports it after a complete response (Litestar's
    streaming response waits for it). No earlier disconnect is ever reported, so nothing
    inside cancels the request."""
    delivered = False

    async def receive() -> ReceiveMessage:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()
        return {"type": "http.disconnect"}

    return receive
