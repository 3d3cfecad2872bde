"""``GET /metrics``: the gateway's series in Prometheus' text format (docs/metrics.md)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get
from litestar.exceptions import NotFoundException

from gateway.http.guard import require_admin
from gateway.telemetry.hub import Telemetry

# The classic text format every Prometheus reads (prometheus_client's default now names
# 1.0.0, which older servers do not know); Litestar adds "; charset=utf-8".
_TEXT_FORMAT = "text/plain; version=0.0.4"


@get("/metrics")
async def prometheus_metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    """404 when ``observability.metrics.enabled`` is off; with ``require_admin`` the
    scrape must carry the admin key (Prometheus' ``authorization`` setting)."""
    settings = request.app.state.gateway.runtime.config.observability.metrics
    if not settings.enabled:
        raise NotFoundException("Metrics are turned off (observability.metrics.enabled).")
    if settings.require_admin:
        require_admin(request)
    telemetry: Telemetry = request.app.state.telemetry
    return Response(telemetry.metrics.render(), media_type=_TEXT_FORMAT)
