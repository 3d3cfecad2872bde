"""Before anything authenticates a request: give a JWT signed with a key the identity
provider just published its one (bounded, rate-limited) JWKS refresh.

Authentication is synchronous everywhere (routes, guards, the idempotency middleware) and
reads only keys already fetched; this outermost ASGI middleware is the one place that may
await the identity provider, and only for a token whose ``kid`` is unknown. Gateways without
``auth.jwt.jwks_url`` or ``discovery`` pay one attribute check per request.
"""

from __future__ import annotations

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

_CREDENTIAL_HEADERS = (b"authorization", b"x-api-key")


def fetch_unknown_jwt_keys(app: ASGIApp) -> ASGIApp:
    """Litestar middleware: await ``Authenticator.prepare`` for HTTP requests."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == ScopeType.HTTP:
            auth = scope["app"].state.gateway.runtime.auth
            if auth.fetches_keys:
                headers = {
                    name.decode("latin-1"): value.decode("latin-1")
                    for name, value in scope["headers"]
                    if name in _CREDENTIAL_HEADERS
                }
                await auth.prepare(headers)
        await app(scope, receive, send)

    return middleware
