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
from typing import Protocol

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
