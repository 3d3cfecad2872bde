"""What every HTTP adapter shares: the status -> error mapping, transport error mapping,
Retry-After parsing and SSE reading. Adapters raise nothing but ``ProviderError`` subclasses.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager

import httpx
import msgspec
from httpx_sse import EventSource, ServerSentEvent

from core.errors import (
    ProviderError,
    UpstreamAuthError,
    UpstreamBadRequestError,
    UpstreamConnectError,
    UpstreamMalformedError,
    UpstreamRateLimitedError,
    UpstreamServerError,
    UpstreamTimeoutError,
)
from core.protocols import CallContext, Capabilities
from core.tracecontext import TRACEPARENT, upstream_traceparent, with_traceparent
from providers.transport import AiohttpTransport

ErrorMessage = Callable[[bytes], tuple[str, str | None]]
"""Reads a vendor error body; returns (message, param)."""


# The longest wait an upstream's Retry-After is taken to mean. Longer values (a typo, an
# HTTP date years ahead, 1e300) all mean "not soon" and are clamped, so nothing downstream
# does arithmetic on, or renders, an astronomical number.
MAX_RETRY_AFTER_S = 86400.0


def parse_retry_after(headers: httpx.Headers, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date),
    within 0..``MAX_RETRY_AFTER_S`` (a negative wait or a past date is 0, a longer one is
    clamped). None when absent or unusable (not a number or date, NaN, infinite)."""
    millis = _seconds(headers.get("retry-after-ms"))
    if millis is not None:
        return _clamped(millis / 1000)
    value = headers.get("retry-after")
    if not value:
        return None
    seconds = _seconds(value)
    if seconds is not None:
        return _clamped(seconds)
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, OverflowError):
        return None
    return _clamped(when - (time.time() if now is None else now))


def _seconds(value: str | None) -> float | None:
    """``value`` as a finite number, else None."""
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _clamped(seconds: float) -> float:
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)


def error_for_status(
    provider: str, response: httpx.Response, body: bytes, read_message: ErrorMessage
) -> ProviderError:
    """The error for a non-2xx upstream answer, carrying the vendor's own message."""
    status = response.status_code
    try:
        message, param = read_message(body)
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError, TypeError, ValueError):
        message, param = body[:300].decode("utf-8", "replace") or response.reason_phrase, None
    text = f"upstream {provider} returned {status}: {message}"
    retry_after = parse_retry_after(response.headers)
    kind: type[ProviderError] = UpstreamServerError
    if status == 429:
        kind = UpstreamRateLimitedError
    elif status in (401, 403):
        kind = UpstreamAuthError
    elif status == 408:
        kind = UpstreamTimeoutError
    elif status in (400, 413, 422):
        # The client's own mistake: pass the vendor's words through unchanged.
        return UpstreamBadRequestError(
            message, provider=provider, upstream_status=status, param=param
        )
    return kind(text, provider=provider, upstream_status=status, retry_after=retry_after)


@contextmanager
def mapped_errors(provider: str) -> Iterator[None]:
    """Turn transport and decoding failures inside the block into ``ProviderError``s."""
    try:
        yield
    except ProviderError:
        raise
    except httpx.TimeoutException as exc:
        raise UpstreamTimeoutError(
            f"upstream {provider} timed out ({type(exc).__name__})", provider=provider
        ) from exc
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.WriteError) as exc:
        # A WriteError means the request never reached the upstream: as safe to retry as
        # a refused connection.
        raise UpstreamConnectError(
            f"cannot connect to upstream {provider}: {exc}", provider=provider
        ) from exc
    except httpx.TransportError as exc:
        raise UpstreamServerError(
            f"upstream {provider} connection failed: {type(exc).__name__}: {exc}",
            provider=provider,
        ) from exc
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise UpstreamMalformedError(
            f"upstream {provider} sent a malformed payload: {exc}", provider=provider
        ) from exc


def timeout_for(ctx: CallContext) -> httpx.Timeout:
    """httpx timeouts for one call: connect as configured, reads bounded by the total."""
    return httpx.Timeout(ctx.timeouts.total, connect=ctx.timeouts.connect)


async def iter_sse(response: httpx.Response) -> AsyncIterator[ServerSentEvent]:
    """The server-sent events of a streaming response, parsed by httpx-sse."""
    async for event in EventSource(response).aiter_sse():
        yield event


class HttpProvider:
    """Base for adapters over a shared ``httpx.AsyncClient`` (the gateway owns and closes it).

    ``api_key`` is the resolved secret (never logged); ``None`` sends no credentials.
    """

    capabilities = Capabilities()

    def __init__(
        self,
        name: str,
        client: httpx.AsyncClient,
        base_url: str,
        api_key: str | None,
        extra_headers: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.client = client
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.extra_headers = dict(extra_headers or {})

    async def start(self) -> None:
        return None

    def is_ready(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None

    async def post_bytes(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        ctx: CallContext,
        read_message: ErrorMessage,
    ) -> bytes:
        """POST ``body`` and return the whole 2xx answer; other statuses raise the mapped
        error. Uses the client's aiohttp transport directly when it has one (the plain path
        of every non-streaming call; see docs/decisions/0002-http-client.md)."""
        headers = with_traceparent(headers)
        fast: AiohttpTransport | None = getattr(self.client, "fast", None)
        if fast is None:
            request = self.client.build_request(
                "POST", url, content=body, headers=headers, timeout=timeout_for(ctx)
            )
            response = await self.send(request, read_message)
            with mapped_errors(self.name):
                return await response.aread()
        with mapped_errors(self.name):
            status, raw_headers, data = await fast.post(
                url, body, headers, ctx.timeouts.connect, ctx.timeouts.total
            )
        if status >= 300:
            response = httpx.Response(status, headers=raw_headers)
            raise error_for_status(self.name, response, data, read_message)
        return data

    async def send(
        self, request: httpx.Request, read_message: ErrorMessage, *, stream: bool = False
    ) -> httpx.Response:
        """Send ``request``; on a non-2xx answer read its body and raise the mapped error.

        With ``stream=True`` the caller owns the open response and must close it.
        """
        if (traceparent := upstream_traceparent.get()) is not None:
            request.headers[TRACEPARENT] = traceparent
        with mapped_errors(self.name):
            response = await self.client.send(request, stream=stream)
            if response.status_code < 300:
                return response
            try:
                body = await response.aread()
            finally:
                await response.aclose()
            raise error_for_status(self.name, response, body, read_message)
