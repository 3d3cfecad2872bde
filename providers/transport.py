"""An httpx transport over aiohttp: adapters keep httpx's API (requests, responses, the
exception tree, ``MockTransport`` in tests) while the bytes move through aiohttp's connection
pool, which costs about a tenth of the CPU of httpcore's per call (bench/http_clients.py;
docs/decisions/0002-http-client.md).

aiohttp's errors are mapped onto httpx's exceptions by what happened, so
``providers.http.mapped_errors`` sees the same classes it would see from httpcore: refused
connection -> ConnectError, connect deadline -> ConnectTimeout, read deadline -> ReadTimeout,
a peer that hangs up or breaks the framing -> RemoteProtocolError, a request that could not
be written on a pooled connection the peer had closed -> WriteError.

Idle pooled connections are dropped after 4 s: below the 5 s keep-alive of uvicorn (and so
vLLM) and most proxies, so a reused connection rarely races the peer's close.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import httpx

_CHUNK = 64 * 1024


@contextmanager
def _mapped(request: httpx.Request | None) -> Iterator[None]:
    try:
        yield
    except aiohttp.ConnectionTimeoutError as exc:
        raise httpx.ConnectTimeout(str(exc) or "connect timed out", request=request) from exc
    except (TimeoutError, aiohttp.SocketTimeoutError) as exc:
        raise httpx.ReadTimeout(str(exc) or "read timed out", request=request) from exc
    except aiohttp.ClientConnectorError as exc:
        raise httpx.ConnectError(str(exc), request=request) from exc
    except aiohttp.ClientConnectionResetError as exc:
        # "Can not write request body": a pooled connection the peer had closed. Nothing
        # reached the upstream, so the call is safe to repeat (providers map this to a
        # retryable connect error).
        raise httpx.WriteError(str(exc) or "connection reset", request=request) from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__, request=request) from exc
    except aiohttp.ClientResponseError as exc:
        raise httpx.RemoteProtocolError(str(exc), request=request) from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise httpx.ReadError(str(exc) or type(exc).__name__, request=request) from exc


class _Body(httpx.AsyncByteStream):
    """The response body as aiohttp receives it; closing it releases the connection."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _mapped(self._request):
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def aclose(self) -> None:
        self._response.release()
        if not self._response.content.is_eof():
            self._response.close()  # unread body: drop the connection instead of reusing it


class AiohttpTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 keep-alive pool of ``max_connections`` sockets, created on first use (an
    aiohttp session must be made inside the running event loop)."""

    def __init__(self, max_connections: int = 1000, keepalive_expiry: float = 4.0) -> None:
        self._limit = max_connections
        self._keepalive = keepalive_expiry
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._limit, keepalive_timeout=self._keepalive)
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=timeouts.get("connect"), sock_read=timeouts.get("read")
        )
        with _mapped(request):
            response = await self._get_session().request(
                request.method,
                str(request.url),
                headers=list(request.headers.multi_items()),
                data=await request.aread() or None,
                allow_redirects=False,
                timeout=timeout,
            )
        return httpx.Response(
            response.status,
            headers=list(response.raw_headers),
            stream=_Body(response, request),
            request=request,
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def post(
        self, url: str, body: bytes, headers: dict[str, str], connect: float, read: float
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """A whole-body POST without httpx's request/response objects: (status, raw headers,
        body). The hot path of non-streaming calls; errors are httpx's, as above."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read)
        with _mapped(None):
            async with self._get_session().post(
                url, data=body, headers=headers, allow_redirects=False, timeout=timeout
            ) as response:
                return response.status, list(response.raw_headers), await response.read()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class SwitchyardClient(httpx.AsyncClient):
    """An httpx client that also exposes its aiohttp transport for whole-body POSTs."""

    def __init__(self, transport: AiohttpTransport, **kwargs: Any) -> None:
        super().__init__(transport=transport, **kwargs)
        self.fast = transport


def make_client(max_connections: int = 1000) -> SwitchyardClient:
    """The shared upstream client. Timeouts are set per request from each target."""
    return SwitchyardClient(
        AiohttpTransport(max_connections=max_connections),
        timeout=httpx.Timeout(600, connect=5),
        trust_env=False,
    )
