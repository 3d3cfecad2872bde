"""The console's live parts: HTML fragments that htmx polls or swaps in (targets, recent
requests, a route explanation) and the overview charts' JSON. Same access rules as the
pages (``Viewer``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from litestar import Request, Response, get

from core.errors import InvalidRequestError
from gateway.console import data
from gateway.console.explain import explain_from_query
from gateway.console.render import SECURITY_HEADERS, html
from gateway.console.state import recent_of, state_of
from gateway.console.timeline import chart_data
from gateway.console.viewer import Viewer, require_viewer
from gateway.telemetry.recent import RecentRequests, StatusFilterError

TAIL_ROWS = 100


def request_filters(viewer: Viewer, params: Mapping[str, str]) -> dict[str, str | None]:
    """The recent requests' filters from the query: ``tenant`` (pinned to a tenant
    admin's own), ``model`` (an alias), ``status`` (``ok``, ``error`` or a code)."""
    return {
        "tenant": viewer.scope(params.get("tenant") or None),
        "model": params.get("model") or None,
        "status": params.get("status") or None,
    }


def requests_context(recent: RecentRequests, filters: dict[str, str | None]) -> dict[str, Any]:
    """The template variables of the requests table; 400 for a bad status filter."""
    try:
        items = recent.tail(
            tenant=filters["tenant"],
            model=filters["model"],
            status=filters["status"],
            limit=TAIL_ROWS,
        )
    except StatusFilterError as exc:
        raise InvalidRequestError(str(exc), param="status") from exc
    return {"items": items, "filtered": any(filters.values())}


@get("/fragments/requests")
async def requests_fragment(request: Request[Any, Any, Any]) -> Response[str]:
    viewer = await require_viewer(request)
    filters = request_filters(viewer, request.query_params)
    return html("requests_table.html", **requests_context(recent_of(request), filters))


@get("/fragments/targets")
async def targets_fragment(request: Request[Any, Any, Any]) -> Response[str]:
    viewer = await require_viewer(request)
    viewer.require_admin()
    return html("targets_table.html", report=data.targets(state_of(request)))


@get("/fragments/explain")
async def explain_fragment(request: Request[Any, Any, Any]) -> Response[str]:
    viewer = await require_viewer(request)
    viewer.require_admin()
    _, explained, problem = explain_from_query(state_of(request), request.query_params)
    if explained is None and problem is None:
        problem = "Choose an alias."
    return html("explain.html", explained=explained, explain_error=problem)


@get("/api/timeline")
async def timeline_json(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The overview's chart data for the viewer's scope (a tenant admin: its tenant)."""
    viewer = await require_viewer(request)
    timeline = recent_of(request).timeline(viewer.scope(None))
    chosen = request.query_params.get("range") or "1h"
    body = chart_data(timeline, state_of(request).clock.wall(), chosen)
    return Response(
        msgspec.json.encode(body), media_type="application/json", headers=SECURITY_HEADERS
    )
