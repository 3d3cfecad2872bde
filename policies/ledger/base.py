"""The usage ledger's contract: one ``UsageRow`` per request, appended durably, read back
in time order for exports.

Backends: ``SqliteLedger`` (``policies.ledger.sqlite``, one process, the embedded default)
and ``RedisStreamLedger`` (``policies.ledger.redis_stream``, shared by replicas).
``policies.ledger.open_ledger`` picks one from the config.

Read filters: ``tenant`` None means every tenant; ``start`` is inclusive and ``end``
exclusive, both Unix seconds compared with ``UsageRow.ts``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from core.tenancy import UsageRow

PAGE_ROWS = 1000  # rows fetched per query when reading; never the whole result at once


class Ledger(Protocol):
    """Where usage rows are committed."""

    async def append(self, row: UsageRow) -> None:
        """Return once ``row`` is durable. Appending a row whose ``request_id`` is already
        there is a no-op (a retried append never counts twice)."""
        ...

    def rows(
        self, *, tenant: str | None = None, start: float | None = None, end: float | None = None
    ) -> AsyncIterator[UsageRow]:
        """The matching rows in time order, fetched page by page (see the backend for how
        exact the order is). Nothing is loaded all at once."""
        ...

    async def aclose(self) -> None:
        """Flush and release; every append that was made before is kept."""
        ...


def matches(row: UsageRow, tenant: str | None, start: float | None, end: float | None) -> bool:
    """Whether ``row`` passes the read filters (see the module docstring)."""
    if tenant is not None and row.tenant != tenant:
        return False
    if start is not None and row.ts < start:
        return False
    return end is None or row.ts < end


COLUMNS: tuple[str, ...] = UsageRow.__struct_fields__  # every backend's row, in this order


def keyset_page_query(
    table: str,
    mark: str,
    tenant: str | None,
    start: float | None,
    end: float | None,
    after: tuple[float, str] | None,
    limit: int,
) -> tuple[str, list[Any]]:
    """The SELECT of one page of ``table`` for the SQL backends (``mark``: the driver's
    placeholder, ``?`` or ``%s``): the read filters plus ``(ts, request_id) > after``
    (keyset pagination: each page is an index range scan, never an OFFSET)."""
    where: list[str] = []
    args: list[Any] = []
    for condition, value in (("tenant =", tenant), ("ts >=", start), ("ts <", end)):
        if value is not None:
            where.append(f"{condition} {mark}")
            args.append(value)
    if after is not None:
        where.append(f"(ts, request_id) > ({mark}, {mark})")
        args.extend(after)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    order = f"ORDER BY ts, request_id LIMIT {mark}"
    return f"SELECT {', '.join(COLUMNS)} FROM {table}{clause} {order}", [*args, limit]
