"""The usage page's numbers: the ledger's rows grouped per day and per model by the very
code that writes the exports (``policies.ledger.export``), read back from its JSON Lines,
so the page, its chart and the CSV/JSONL buttons cannot disagree."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from litestar.response import Stream

from core.errors import ServiceUnavailableError
from policies.ledger import Ledger
from policies.ledger.export import CONTENT_TYPES, ExportQuery, GroupBy, export_lines, prime
from policies.store.base import StoreUnavailableError

DEFAULT_DAYS = 30
_decoder = msgspec.json.Decoder(dict[str, Any])


def default_range(now: float, days: int = DEFAULT_DAYS) -> tuple[str, str]:
    """(first day, last day) as ISO dates: the ``days`` days up to and including today
    (UTC)."""
    today = datetime.fromtimestamp(now, UTC).date()
    return (today - timedelta(days=days - 1)).isoformat(), today.isoformat()


async def _rows(ledger: Ledger, query: ExportQuery) -> Any:
    rows = ledger.rows(tenant=query.tenant, start=query.start, end=query.end)
    try:
        return await prime(rows)
    except StoreUnavailableError as exc:
        raise ServiceUnavailableError(f"The usage ledger is unreachable: {exc}") from exc


async def grouped(ledger: Ledger, query: ExportQuery, group_by: GroupBy) -> list[dict[str, Any]]:
    """The export's records for ``query`` grouped by ``group_by`` (its JSON Lines, decoded).
    503 when the ledger cannot be read."""
    lines = export_lines(await _rows(ledger, query), "jsonl", group_by)
    return [_decoder.decode(line) async for line in lines]


def cost_chart(by_day: list[dict[str, Any]]) -> dict[str, Any]:
    """Chart.js data for cost per day, one dataset per tenant (days without usage: 0)."""
    days = sorted({r["ChargePeriodStart"][:10] for r in by_day})
    tenants = sorted({r["SubAccountId"] or "" for r in by_day})
    cost = {(r["ChargePeriodStart"][:10], r["SubAccountId"] or ""): r["BilledCost"] for r in by_day}
    datasets = [
        {"label": tenant or "(no tenant)", "data": [cost.get((day, tenant), 0.0) for day in days]}
        for tenant in tenants
    ]
    return {"labels": days, "datasets": datasets}


async def export_stream(ledger: Ledger, query: ExportQuery) -> Stream:
    """The export download, as ``GET /admin/usage`` streams it."""
    rows = await _rows(ledger, query)
    return Stream(
        export_lines(rows, query.fmt, query.group_by),
        media_type=CONTENT_TYPES[query.fmt],
        headers={
            "content-disposition": f'attachment; filename="usage.{query.fmt}"',
            "cache-control": "no-store",
            "x-content-type-options": "nosniff",
        },
    )
