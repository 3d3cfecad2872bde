"""Server-sent events as OpenAI writes them: ``data: <json>\\n\\n`` ... ``data: [DONE]``."""

from __future__ import annotations

from core.errors import GatewayError
from gateway.http.errors import error_body

DONE = b"data: [DONE]\n\n"


def frame(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def error_frame(exc: GatewayError) -> bytes:
    """The event that ends a stream that failed after its first byte; the OpenAI SDKs raise
    an ``APIError`` when they read it."""
    return frame(error_body(exc))
