"""Who is calling, for handlers outside the request pipeline (admin and usage routes)."""

from __future__ import annotations

from typing import Any

from litestar import Request

from core.tenancy import Principal


def authenticate(request: Request[Any, Any, Any]) -> Principal:
    """The caller (401 on missing or bad credentials; open gateways let anyone in)."""
    principal: Principal = request.app.state.gateway.runtime.auth.authenticate(request.headers)
    return principal


def require_admin(request: Request[Any, Any, Any]) -> Principal:
    """The admin principal, else 401 (no credentials) or 403 (a tenant's credentials).

    On an open gateway without an admin key the admin routes stay closed: an open
    gateway must not let anyone reload its policy or read every tenant's usage."""
    principal = authenticate(request)
    request.app.state.gateway.runtime.auth.require_admin(principal)
    return principal
