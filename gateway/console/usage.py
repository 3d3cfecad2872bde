"""The usage page's numbers: the ledger's rows grouped per day and per model by the very
code that writes the exports (``policies.ledger.export``), read back from its JSON Lines,
so the page, its chart and the CSV/JSONL buttons cannot disagree."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from gateway.routes.usage import ledger_rows
from policies.ledger import Ledger
from policies.ledger.export import ExportQuery, GroupBy, export_lines

DEFAULT_DAYS = 30
_decoder = msgspec.json.Decoder(dict[str, Any])


def default_range(now: float, days: int = DEFAULT_DAYS) -> tuple[str, str]:
    """(first day, last day) as ISO dates: the ``days`` days up to and including today
    (UTC)."""
    today = datetime.fromtimestamp(now, UTC).date()
    return (today - timedelta(days=days - 1)).isoformat(), today.isoformat()


async def grouped(ledger: Ledger, query: ExportQuery, group_by: GroupBy) -> list[dict[str, Any]]:
    """The export's records for ``query`` grouped by ``group_by`` (its JSON Lines, decoded).
    503 when the ledger cannot be read."""
    lines = export_lines(await ledger_rows(ledger, query), "jsonl", group_by)
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
