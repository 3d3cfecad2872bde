"""The console's pages (GET): overview, targets, tenants and keys, usage, routing, recent
requests, and the login form. Every page needs a live session (else the login page); the
admin sees everything, a tenant admin its own tenant only (``Viewer.scope``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from litestar import Request, Response, get
from litestar.datastructures import Cookie
from litestar.response import Stream

from gateway.console import data
from gateway.console.explain import explain_from_query
from gateway.console.fragments import request_filters, requests_context
from gateway.console.render import html, redirect, tenant_page
from gateway.console.session import COOKIE_PATH, LOGIN_COOKIE, new_token
from gateway.console.state import recent_of, reloader_of, state_of
from gateway.console.timeline import RANGES, range_of, summary
from gateway.console.usage import cost_chart, default_range, grouped
from gateway.console.viewer import current_viewer, not_found, require_viewer
from gateway.routes.usage import export_stream
from policies.ledger.export import parse_query


@get("/")
async def home(request: Request[Any, Any, Any]) -> Response[str]:
    viewer = await current_viewer(request)
    return redirect("/console/overview" if viewer is not None else "/console/login")


@get("/login")
async def login_form(request: Request[Any, Any, Any]) -> Response[str]:
    """The login form, with a fresh double-submit token in a cookie and in the form."""
    if await current_viewer(request) is not None:
        return redirect("/console/overview")
    return login_page(request)


def login_page(
    request: Request[Any, Any, Any], error: str | None = None, status: int = 200
) -> Response[str]:
    token = new_token()
    cookie = Cookie(
        key=LOGIN_COOKIE,
        value=token,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=is_https(request),
        max_age=3600,
    )
    return html(
        "login.html",
        status,
        [cookie],
        title="Log in",
        viewer=None,
        page="login",
        login_token=token,
        error=error,
    )


def is_https(request: Request[Any, Any, Any]) -> bool:
    """Whether the browser reached us over TLS (directly, or through a proxy that says
    so): cookies are then marked ``Secure``."""
    forwarded = request.headers.get("x-forwarded-proto", "")
    return request.url.scheme == "https" or forwarded.lower() == "https"


@get("/overview")
async def overview(request: Request[Any, Any, Any]) -> Response[str]:
    viewer = await require_viewer(request)
    chosen = request.query_params.get("range") or "1h"
    scope = viewer.scope(None)
    span_s, _ = range_of(chosen)
    timeline = recent_of(request).timeline(scope)
    totals = summary(timeline, state_of(request).clock.wall(), span_s)
    return html(
        "overview.html",
        title="Overview",
        viewer=viewer,
        page="overview",
        charts=True,
        scope=scope,
        ranges=[(k, label) for k, (_, _, label) in RANGES.items()],
        range=chosen,
        summary=totals,
    )


@get("/targets")
async def targets(request: Request[Any, Any, Any]) -> Response[str]:
    viewer = await require_viewer(request)
    viewer.require_admin()
    report = data.targets(state_of(request))
    return html("targets.html", title="Targets", viewer=viewer, page="targets", report=report)


@get("/tenants")
async def tenants(request: Request[Any, Any, Any]) -> Response[str]:
    viewer = await require_viewer(request)
    if not viewer.admin:
        return redirect(tenant_page(viewer.tenant or ""))
    state = state_of(request)
    views = await data.tenant_views(state, None)
    return html(
        "tenants.html",
        title="Tenants",
        viewer=viewer,
        page="tenants",
        tenants=views,
        control=state.control is not None,
    )


@get("/tenants/{name:str}")
async def tenant(request: Request[Any, Any, Any], name: str) -> Response[str]:
    viewer = await require_viewer(request)
    state = state_of(request)
    if not viewer.may_see(name) or name not in state.runtime.config.tenants:
        raise not_found()
    (view,) = await data.tenant_views(state, name)
    return html(
        "tenant.html",
        title=f"Tenant {name}",
        viewer=viewer,
        page="tenants",
        t=view,
        control=state.control is not None,
        limit_fields=data.LIMIT_FIELDS,
        aliases=data.allowed_aliases(state, name),
    )


@get("/usage")
async def usage(request: Request[Any, Any, Any]) -> Response[str]:
    viewer = await require_viewer(request)
    state = state_of(request)
    params = request.query_params
    first, last = default_range(state.clock.wall())
    start, end = params.get("from") or first, params.get("to") or last
    scope = viewer.scope(params.get("tenant"))
    query = parse_query(tenant=scope, start=start, end=end)
    by_day = await grouped(state.ledger, query, "day")
    by_model = await grouped(state.ledger, query, "model")
    export_query = urlencode({"tenant": scope or "", "from": start, "to": end})
    return html(
        "usage.html",
        title="Usage",
        viewer=viewer,
        page="usage",
        charts=True,
        scope=scope,
        tenant_names=sorted(state.runtime.config.tenants),
        start=start,
        end=end,
        export_query=export_query,
        by_day=by_day,
        by_model=by_model,
        chart=cost_chart(by_day),
    )


@get("/routing")
async def routing(request: Request[Any, Any, Any]) -> Response[str]:
    viewer = await require_viewer(request)
    viewer.require_admin()
    state = state_of(request)
    config = state.runtime.config
    form, explained, problem = explain_from_query(state, request.query_params)
    policy = await data.policy_view(state, reloader_of(request))
    return html(
        "routing.html",
        title="Routing",
        viewer=viewer,
        page="routing",
        policy=policy,
        aliases=sorted(config.models),
        tenant_names=sorted(config.tenants),
        form=form,
        explained=explained,
        explain_error=problem,
    )


@get("/requests")
async def requests(request: Request[Any, Any, Any]) -> Response[str]:
    viewer = await require_viewer(request)
    filters = request_filters(viewer, request.query_params)
    query = urlencode({k: v for k, v in filters.items() if v})
    return html(
        "requests.html",
        title="Recent requests",
        viewer=viewer,
        page="requests",
        scope=filters["tenant"] if not viewer.admin else None,
        filters=filters,
        query=query,
        **requests_context(recent_of(request), filters),
    )


@get("/usage/export")
async def usage_export(request: Request[Any, Any, Any]) -> Stream:
    """The export download (``format``, ``group_by``, ``tenant``, ``from``, ``to`` as for
    ``GET /admin/usage``), pinned to a tenant admin's own tenant."""
    viewer = await require_viewer(request)
    params = request.query_params
    query = parse_query(
        tenant=viewer.scope(params.get("tenant") or None),
        start=params.get("from"),
        end=params.get("to"),
        group_by=params.get("group_by"),
        fmt=params.get("format"),
    )
    return await export_stream(state_of(request).ledger, query)


@get("/{rest:path}")
async def unknown(request: Request[Any, Any, Any], rest: str) -> Response[str]:
    """Any other path under /console: the login page without a session, else a 404 page
    (the same as for another tenant's page)."""
    await require_viewer(request)
    raise not_found()
