"""The control plane's failures, as gateway errors (OpenAI's error shape on the admin API;
the CLI prints their messages)."""

from __future__ import annotations

from core.errors import GatewayError, InvalidRequestError, ServiceUnavailableError

__all__ = [
    "ConflictError",
    "ControlUnavailableError",
    "InvalidRequestError",
    "NotFoundError",
]


class NotFoundError(GatewayError):
    """404: no key or tenant by that name."""

    status = 404
    type = "invalid_request_error"


class ConflictError(GatewayError):
    """409: the change contradicts the current state (revoking a revoked key, creating a
    tenant that exists)."""

    status = 409
    type = "invalid_request_error"


class ControlUnavailableError(ServiceUnavailableError):
    """503: the control store cannot be reached or failed mid-change (nothing changed)."""
