"""Status and Retry-After mapping shared by every HTTP adapter."""

from __future__ import annotations

import email.utils

import httpx
import pytest

from core.errors import (
    UpstreamAuthError,
    UpstreamBadRequestError,
    UpstreamRateLimitedError,
    UpstreamServerError,
    UpstreamTimeoutError,
)
from providers.http import error_for_status, parse_retry_after


def read(body: bytes) -> tuple[str, str | None]:
    if body == b"broken":
        raise ValueError("not json")
    return body.decode(), "messages"


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, UpstreamBadRequestError),
        (413, UpstreamBadRequestError),
        (422, UpstreamBadRequestError),
        (401, UpstreamAuthError),
        (403, UpstreamAuthError),
        (408, UpstreamTimeoutError),
        (429, UpstreamRateLimitedError),
        (404, UpstreamServerError),
        (500, UpstreamServerError),
        (503, UpstreamServerError),
        (529, UpstreamServerError),
    ],
)
def test_status_mapping(status, kind):
    response = httpx.Response(status, headers={"retry-after": "3"})
    error = error_for_status("p", response, b"vendor says no", read)
    assert type(error) is kind
    assert error.provider == "p" and error.upstream_status == status
    assert "vendor says no" in error.message
    if kind is UpstreamBadRequestError:
        assert error.param == "messages" and not error.fallback_ok
    else:
        assert error.fallback_ok


def test_unreadable_error_body_is_quoted():
    error = error_for_status("p", httpx.Response(502), b"broken", read)
    assert "broken" in error.message


def test_retry_after_forms():
    assert parse_retry_after(httpx.Headers({"retry-after": "7"})) == 7
    assert parse_retry_after(httpx.Headers({"retry-after-ms": "1500", "retry-after": "9"})) == 1.5
    date = email.utils.formatdate(1_000_030, usegmt=True)
    assert parse_retry_after(httpx.Headers({"retry-after": date}), now=1_000_000) == 30
    assert parse_retry_after(httpx.Headers({"retry-after": "soon"})) is None
    assert parse_retry_after(httpx.Headers({})) is None
    assert parse_retry_after(httpx.Headers({"retry-after": "-4"})) == 0


def test_unwritable_pooled_connection_is_a_retryable_connect_error():
    """aiohttp's "Can not write request body" (the peer closed a pooled connection) reaches
    the providers as httpx.WriteError and becomes a retryable UpstreamConnectError."""
    import aiohttp

    from core.errors import UpstreamConnectError
    from providers.http import mapped_errors
    from providers.transport import _mapped

    with pytest.raises(httpx.WriteError) as written, _mapped(None):
        raise aiohttp.ClientConnectionResetError("Can not write request body")
    with pytest.raises(UpstreamConnectError) as mapped, mapped_errors("p"):
        raise written.value
    assert mapped.value.retryable and mapped.value.fallback_ok
