"""HTML answers of the console: Jinja2 templates with autoescaping on for every template
(every value is escaped unless a template says otherwise, and none does), and the security
headers every console answer carries (a strict Content-Security-Policy: no inline script or
style, nothing from another origin, no framing)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from litestar import Response
from litestar.datastructures import Cookie

from core.errors import GatewayError

TEMPLATES = Path(__file__).parent / "templates"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
_HTML = "text/html"  # Litestar adds "; charset=utf-8"


def when(ts: float | None) -> str:
    """Unix seconds as ``2026-01-31 12:00:00Z`` (empty for None)."""
    if ts is None or not math.isfinite(ts):
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def number(value: float | None, digits: int = 2) -> str:
    """A number for a table cell: fixed digits, no exponent (empty for None)."""
    if value is None:
        return ""
    return f"{value:,.{digits}f}"


def usd(value: float | None) -> str:
    return "" if value is None else f"${value:,.6f}".rstrip("0").rstrip(".")


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,  # every template, whatever its name
        undefined=StrictUndefined,  # a misspelt variable is a bug, not an empty cell
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=when, number=number, usd=usd)
    return env


ENVIRONMENT = _environment()


def html(
    template: str,
    status: int = 200,
    cookies: list[Cookie] | None = None,
    headers: dict[str, str] | None = None,
    **context: Any,
) -> Response[str]:
    """``template`` rendered with ``context``, with the console's security headers."""
    body = ENVIRONMENT.get_template(template).render(**context)
    return Response(
        body,
        status_code=status,
        media_type=_HTML,
        headers={**SECURITY_HEADERS, **(headers or {})},
        cookies=cookies or [],
    )


def redirect(location: str, cookies: list[Cookie] | None = None) -> Response[str]:
    """A 303 to another console page (after a form, or to the login page)."""
    headers = {**SECURITY_HEADERS, "location": location}
    return Response("", status_code=303, headers=headers, cookies=cookies or [])


def htmx_redirect(location: str) -> Response[str]:
    """Send an htmx fragment request's page to ``location``: a redirect would be followed
    by the browser's fetch and its target swapped into the page, so htmx is told with
    ``HX-Redirect`` on an empty 200 instead."""
    return Response("", status_code=200, headers={**SECURITY_HEADERS, "hx-redirect": location})


def tenant_page(tenant: str) -> str:
    """The path of a tenant's page (the name quoted: any character may be in it)."""
    return "/console/tenants/" + quote(tenant, safe="")


def error_page(error: GatewayError, viewer: Any = None) -> Response[str]:
    """A console error: its status, the message (escaped), a way back."""
    return html("error.html", status=error.status, error=error, viewer=viewer, page="")
