"""Usage exports over HTTP: ``GET /admin/usage`` (admin key, any tenant) and
``GET /v1/usage`` (a tenant's key: that tenant's rows only).

Query parameters: ``tenant``, ``from``, ``to`` (ISO dates or datetimes in UTC, or Unix
seconds; a date as ``to`` includes that day), ``group_by`` (``day``|``model``|``key``),
``format`` (``csv``|``jsonl``, default ``jsonl``). The body is streamed; columns are in
``docs/usage_export.md``. Bad values -> 400 naming the parameter; another tenant's rows ->
403; an unreachable ledger -> 503 before the response starts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, get
from litestar.response import Stream

from core.errors import PermissionDeniedError, ServiceUnavailableError
from core.tenancy import Principal, UsageRow
from gateway.http.guard import authenticate, require_admin
from policies.ledger import Ledger
from policies.ledger.export import CONTENT_TYPES, ExportQuery, export_lines, parse_query, prime
from policies.store.base import StoreUnavailableError


def _query(request: Request[Any, Any, Any]) -> ExportQuery:
    params = request.query_params
    return parse_query(
        tenant=params.get("tenant"),
        start=params.get("from"),
        end=params.get("to"),
        group_by=params.get("group_by"),
        fmt=params.get("format"),
    )


def _own_tenant(principal: Principal, query: ExportQuery) -> ExportQuery:
    """Pin a tenant's query to its own rows; naming another tenant is refused."""
    if principal.admin:
        return query
    if principal.tenant is None:
        if principal.via == "open":  # an open gateway has no tenants to keep apart
            return query
        raise PermissionDeniedError("These credentials are not bound to a tenant.")
    if query.tenant not in (None, principal.tenant):
        raise PermissionDeniedError(
            "An API key can read its own tenant's usage only.", param="tenant"
        )
    return ExportQuery(
        tenant=principal.tenant,
        start=query.start,
        end=query.end,
        group_by=query.group_by,
        fmt=query.fmt,
    )


async def _export(request: Request[Any, Any, Any], query: ExportQuery) -> Stream:
    return await export_stream(request.app.state.gateway.ledger, query)


async def ledger_rows(ledger: Ledger, query: ExportQuery) -> AsyncIterator[UsageRow]:
    """``query``'s rows, the first page already read: 503 when the ledger is unreachable
    (before any byte of an answer is sent)."""
    rows = ledger.rows(tenant=query.tenant, start=query.start, end=query.end)
    try:
        return await prime(rows)
    except StoreUnavailableError as exc:
        raise ServiceUnavailableError(f"The usage ledger is unreachable: {exc}") from exc


async def export_stream(ledger: Ledger, query: ExportQuery) -> Stream:
    """The export download (``/admin/usage``, ``/v1/usage``, the console's buttons)."""
    return Stream(
        export_lines(await ledger_rows(ledger, query), query.fmt, query.group_by),
        media_type=CONTENT_TYPES[query.fmt],
        headers={
            "content-disposition": f'attachment; filename="usage.{query.fmt}"',
            "cache-control": "no-store",
            "x-content-type-options": "nosniff",
        },
    )


@get("/admin/usage")
async def admin_usage(request: Request[Any, Any, Any]) -> Stream:
    """Every tenant's usage (or the one ``tenant`` names); admin key only."""
    require_admin(request)
    return await _export(request, _query(request))


@get("/v1/usage")
async def tenant_usage(request: Request[Any, Any, Any]) -> Stream:
    """The calling key's tenant's usage; ``tenant`` naming another tenant -> 403."""
    principal = authenticate(request)
    return await _export(request, _own_tenant(principal, _query(request)))
