"""The W3C ``traceparent`` an upstream call carries, passed from the gateway (which owns
the trace) to the providers (which send the call) without either importing the other.

The gateway sets it in the context of the task that makes the call, right before the call
is created; HTTP providers read it when they build the request. ``None``: tracing is off
and nothing is sent (the client's own ``traceparent`` is never forwarded blindly).
"""

from __future__ import annotations

from contextvars import ContextVar

TRACEPARENT = "traceparent"
upstream_traceparent: ContextVar[str | None] = ContextVar("upstream_traceparent", default=None)


def with_traceparent(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` plus the current ``traceparent`` (a copy; the original is shared)."""
    value = upstream_traceparent.get()
    if value is None:
        return headers
    return {**headers, TRACEPARENT: value}
