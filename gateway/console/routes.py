"""The console's router: every page, fragment and form under ``/console``, its static
files, and its error answers (HTML pages, not JSON: the console's dialect is the browser;
a missing session sends the browser to the login page). Kept out of ``/openapi.json``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog
from litestar import Request, Response, Router
from litestar.datastructures import CacheControlHeader
from litestar.exceptions import HTTPException
from litestar.static_files import create_static_files_router

from core.errors import GatewayError, ServiceUnavailableError
from gateway.console import actions, fragments, pages
from gateway.console.render import SECURITY_HEADERS, error_page, htmx_redirect, redirect
from gateway.console.viewer import LoginRequired
from gateway.http.errors import from_http, internal_error
from policies.store.base import StoreUnavailableError

PATH = "/console"
STATIC = Path(__file__).parent / "static"
_log = structlog.get_logger("switchyard")


def _login_required(request: Request[Any, Any, Any], exc: LoginRequired) -> Response[str]:
    if request.headers.get("hx-request"):
        return htmx_redirect(PATH + "/login")
    return redirect(PATH + "/login")


def _gateway_error(request: Request[Any, Any, Any], exc: GatewayError) -> Response[str]:
    return error_page(exc)


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[str]:
    return error_page(from_http(exc))


def _store_down(request: Request[Any, Any, Any], exc: StoreUnavailableError) -> Response[str]:
    return error_page(ServiceUnavailableError(f"The gateway's shared store is unreachable: {exc}"))


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[str]:
    _log.exception("console.unhandled_error", path=request.url.path)
    return error_page(internal_error())


def _static_headers(response: Response[Any]) -> Response[Any]:
    response.headers.update(SECURITY_HEADERS)
    response.headers["cache-control"] = "public, max-age=300"
    return response


def console_router() -> Router:
    """``/console`` and ``/console/static`` (the vendored htmx and Chart.js, our CSS and
    script)."""
    handlers: list[Any] = [
        pages.home,
        pages.login_form,
        pages.overview,
        pages.targets,
        pages.tenants,
        pages.tenant,
        pages.usage,
        pages.usage_export,
        pages.routing,
        pages.requests,
        pages.unknown,
        fragments.requests_fragment,
        fragments.targets_fragment,
        fragments.explain_fragment,
        fragments.timeline_json,
        actions.login,
        actions.logout,
        actions.create_key,
        actions.rotate_key,
        actions.revoke_key,
        actions.tenant_settings,
        create_static_files_router(
            path="/static",
            directories=[STATIC],
            cache_control=CacheControlHeader(max_age=300, public=True),
            after_request=_static_headers,
            name="console_static",
        ),
    ]
    return Router(
        path=PATH,
        route_handlers=handlers,
        include_in_schema=False,
        exception_handlers={
            LoginRequired: _login_required,
            StoreUnavailableError: _store_down,
            GatewayError: _gateway_error,
            HTTPException: _http_error,
            Exception: _unexpected,
        },
    )
