"""Usage exports: ledger rows streamed out as CSV or JSON Lines, one row per request or
aggregated per day, model or key, plus parsing of the export filters.

The columns are documented in ``docs/usage_export.md`` (FinOps FOCUS names where a FOCUS
column means the same thing: ``BilledCost``, ``EffectiveCost``, ``BillingCurrency``,
``ChargePeriodStart``/``End``, ``ChargeCategory``, ``ConsumedQuantity``/``Unit``,
``SubAccountId`` for the tenant, ``ResourceId`` for the upstream model, ``Tags`` for
the API key's metadata as JSON text). Times are ISO 8601 UTC
(``2024-05-01T12:00:00.000Z``). ``RAW_COLUMNS`` and ``GROUP_COLUMNS`` are the order.

Nothing is buffered beyond one line: CSV starts with its header before the first row is
read; with ``group_by`` the input is consumed fully but only one running total per group
is held, and the groups are written at the end, sorted.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import AsyncIterator, Callable
from datetime import UTC, date, datetime
from typing import Any, Literal, cast

import msgspec

from core.errors import InvalidRequestError
from core.tenancy import UsageRow

Format = Literal["csv", "jsonl"]
GroupBy = Literal["day", "model", "key"]
FORMATS: tuple[Format, ...] = ("csv", "jsonl")
GROUP_BYS: tuple[GroupBy, ...] = ("day", "model", "key")
CONTENT_TYPES: dict[Format, str] = {
    "csv": "text/csv; charset=utf-8",
    "jsonl": "application/x-ndjson",
}
CURRENCY = "USD"
TOKENS = "Tokens"
USAGE = "Usage"

RAW_COLUMNS: tuple[str, ...] = (
    "request_id", "ChargePeriodStart", "ChargePeriodEnd", "ChargeCategory", "SubAccountId",
    "key_id", "model", "provider", "ResourceId", "endpoint", "stream", "status", "error",
    "prompt_tokens", "completion_tokens", "cached_tokens", "ConsumedQuantity", "ConsumedUnit",
    "BilledCost", "EffectiveCost", "BillingCurrency", "ttft_ms", "latency_ms", "queue_ms",
    "attempts", "fallbacks", "cache_hit", "client_request_id", "usage_estimated", "Tags",
)  # fmt: skip
GROUP_COLUMNS: tuple[str, ...] = (
    "ChargePeriodStart", "ChargePeriodEnd", "ChargeCategory", "SubAccountId", "key_id",
    "model", "provider", "ResourceId", "requests", "errors", "prompt_tokens",
    "completion_tokens", "cached_tokens", "ConsumedQuantity", "ConsumedUnit", "BilledCost",
    "EffectiveCost", "BillingCurrency",
)  # fmt: skip


class ExportQuery(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed export request: filters (``start`` inclusive, ``end`` exclusive, Unix
    seconds) and the output's shape."""

    tenant: str | None = None
    start: float | None = None
    end: float | None = None
    group_by: GroupBy | None = None
    fmt: Format = "jsonl"


# ---------------------------------------------------------------- filters

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_DAY_S = 86400.0
# The times a filter may name: the Unix epoch up to the end of year 9999, the range ISO 8601
# dates and ``datetime`` cover. Every backend takes these without overflow (the Redis
# ledger turns them into millisecond stream ids); no ledger row lies outside them.
EARLIEST_S = 0.0
LATEST_S = 253402300800.0  # 10000-01-01T00:00:00Z


def parse_time(value: str | None, param: str, *, end: bool = False) -> float | None:
    """Unix seconds from ``value``: Unix seconds (``1714564800``), an ISO date
    (``2024-05-01``, midnight UTC) or an ISO datetime (naive means UTC). A date given as an
    ``end`` covers that whole day (its end is the next midnight), so ``from=2024-05-01&
    to=2024-05-31`` is all of May. Empty -> None. Anything else, and any time outside
    ``EARLIEST_S``..``LATEST_S`` (1970 to the end of 9999), -> ``InvalidRequestError`` with
    ``param``."""
    text = (value or "").strip()
    if not text:
        return None
    seconds = _seconds(text, param, end)
    if not EARLIEST_S <= seconds <= LATEST_S:
        raise InvalidRequestError(
            f"'{param}' must lie between 1970-01-01 and 9999-12-31 (Unix seconds 0 to"
            f" {LATEST_S:.0f}); got {text[:64]!r}",
            param=param,
        )
    return seconds


def _seconds(text: str, param: str, end: bool) -> float:
    """``text`` as Unix seconds, unchecked for range; a 400 naming ``param`` when it is
    neither a finite number nor an ISO date or datetime."""
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(seconds):
            return seconds
        raise InvalidRequestError(f"'{param}' must be a finite time", param=param)
    try:
        if _DATE.fullmatch(text):
            day = datetime.combine(date.fromisoformat(text), datetime.min.time(), UTC)
            # seconds, not ``day + 1 day``: the day after 9999-12-31 is not a ``date``
            return day.timestamp() + (_DAY_S if end else 0.0)
        moment = datetime.fromisoformat(text)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    except (ValueError, OverflowError):
        raise InvalidRequestError(
            f"'{param}' must be an ISO 8601 date or datetime, or Unix seconds; got {text[:64]!r}",
            param=param,
        ) from None


def _choice(value: str | None, allowed: tuple[str, ...], param: str) -> str | None:
    text = (value or "").strip().lower()
    if not text:
        return None
    if text not in allowed:
        raise InvalidRequestError(
            f"'{param}' must be one of {', '.join(allowed)}; got {value!r}", param=param
        )
    return text


def parse_query(
    *,
    tenant: str | None = None,
    start: str | None = None,
    end: str | None = None,
    group_by: str | None = None,
    fmt: str | None = None,
) -> ExportQuery:
    """Validate raw filter values (query parameters or CLI options); errors name the
    parameter (``from``, ``to``, ``group_by``, ``format``)."""
    begin = parse_time(start, "from")
    finish = parse_time(end, "to", end=True)
    if begin is not None and finish is not None and finish <= begin:
        raise InvalidRequestError("'to' must be later than 'from'", param="to")
    return ExportQuery(
        tenant=(tenant or "").strip() or None,
        start=begin,
        end=finish,
        group_by=cast(GroupBy | None, _choice(group_by, GROUP_BYS, "group_by")),
        fmt=cast(Format, _choice(fmt, FORMATS, "format") or "jsonl"),
    )


# ---------------------------------------------------------------- records


def iso(ts: float) -> str:
    """ISO 8601 UTC with milliseconds and a ``Z``."""
    moment = datetime.fromtimestamp(ts, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def raw_record(row: UsageRow) -> dict[str, Any]:
    """One request's export record (keys in ``RAW_COLUMNS`` order)."""
    return {
        "request_id": row.request_id,
        "ChargePeriodStart": iso(row.ts),
        "ChargePeriodEnd": iso(row.ts + row.latency_ms / 1000.0),
        "ChargeCategory": USAGE,
        "SubAccountId": row.tenant,
        "key_id": row.key_id,
        "model": row.model,
        "provider": row.provider,
        "ResourceId": row.upstream_model,
        "endpoint": row.endpoint,
        "stream": row.stream,
        "status": row.status,
        "error": row.error,
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "cached_tokens": row.cached_tokens,
        "ConsumedQuantity": row.prompt_tokens + row.completion_tokens,
        "ConsumedUnit": TOKENS,
        "BilledCost": row.cost_usd,
        "EffectiveCost": row.cost_usd,
        "BillingCurrency": CURRENCY,
        "ttft_ms": row.ttft_ms,
        "latency_ms": row.latency_ms,
        "queue_ms": row.queue_ms,
        "attempts": row.attempts,
        "fallbacks": row.fallbacks,
        "cache_hit": row.cache_hit,
        "client_request_id": row.client_request_id,
        "usage_estimated": row.usage_estimated,
        "Tags": row.tags,
    }


class _Sum:
    """Compensated (Neumaier) float sum: a month of tiny per-request costs adds up without
    drifting from the exact total."""

    __slots__ = ("carry", "total")

    def __init__(self) -> None:
        self.total = 0.0
        self.carry = 0.0

    def add(self, value: float) -> None:
        result = self.total + value
        if abs(self.total) >= abs(value):
            self.carry += (self.total - result) + value
        else:
            self.carry += (value - result) + self.total
        self.total = result

    @property
    def value(self) -> float:
        return self.total + self.carry


class _Group:
    """Running totals of one group."""

    __slots__ = ("cached", "completion", "cost", "errors", "first", "last", "prompt", "requests")

    def __init__(self) -> None:
        self.requests = self.errors = self.prompt = self.completion = self.cached = 0
        self.cost = _Sum()
        self.first = math.inf
        self.last = -math.inf

    def add(self, row: UsageRow) -> None:
        self.requests += 1
        self.errors += row.status >= 400
        self.prompt += row.prompt_tokens
        self.completion += row.completion_tokens
        self.cached += row.cached_tokens
        self.cost.add(row.cost_usd)
        self.first = min(self.first, row.ts)
        self.last = max(self.last, row.ts + row.latency_ms / 1000.0)


# The group key: (tenant, day start, key_id, model, provider, upstream_model), with the
# dimensions a grouping does not use left None.
_Key = tuple[str | None, float | None, str | None, str | None, str | None, str | None]


def _day(ts: float) -> float:
    return math.floor(ts / 86400.0) * 86400.0


_KEYS: dict[GroupBy, Callable[[UsageRow], _Key]] = {
    "day": lambda r: (r.tenant, _day(r.ts), None, None, None, None),
    "model": lambda r: (r.tenant, None, None, r.model, r.provider, r.upstream_model),
    "key": lambda r: (r.tenant, None, r.key_id, None, None, None),
}


def _sort_key(key: _Key) -> tuple[Any, ...]:
    # None sorts first; the day (when set) leads so day exports read chronologically.
    tenant, day, *rest = key
    return (day or 0.0, *((v is not None, v or "") for v in (tenant, *rest)))


def group_record(key: _Key, group: _Group) -> dict[str, Any]:
    """One group's export record (keys in ``GROUP_COLUMNS`` order)."""
    tenant, day, key_id, model, provider, upstream = key
    start, end = (day, day + 86400.0) if day is not None else (group.first, group.last)
    cost = group.cost.value
    return {
        "ChargePeriodStart": iso(start),
        "ChargePeriodEnd": iso(end),
        "ChargeCategory": USAGE,
        "SubAccountId": tenant,
        "key_id": key_id,
        "model": model,
        "provider": provider,
        "ResourceId": upstream,
        "requests": group.requests,
        "errors": group.errors,
        "prompt_tokens": group.prompt,
        "completion_tokens": group.completion,
        "cached_tokens": group.cached,
        "ConsumedQuantity": group.prompt + group.completion,
        "ConsumedUnit": TOKENS,
        "BilledCost": cost,
        "EffectiveCost": cost,
        "BillingCurrency": CURRENCY,
    }


async def _grouped(
    rows: AsyncIterator[UsageRow], group_by: GroupBy
) -> AsyncIterator[dict[str, Any]]:
    groups: dict[_Key, _Group] = {}
    key_of = _KEYS[group_by]
    async for row in rows:
        key = key_of(row)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group()
        group.add(row)
    for key in sorted(groups, key=_sort_key):
        yield group_record(key, groups[key])


# ---------------------------------------------------------------- encoding


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        # Fixed point (no 7.5e-06): spreadsheets read it; 12 decimals keep pico-dollars.
        text = f"{value:.12f}".rstrip("0").rstrip(".")
        return "0" if text in ("", "-0") else text
    return str(value)


class _CsvLine:
    """Encodes one CSV line at a time (RFC 4180 quoting, CRLF)."""

    def __init__(self) -> None:
        self._buffer = io.StringIO()
        self._writer = csv.writer(self._buffer)

    def __call__(self, values: Any) -> bytes:
        self._buffer.seek(0)
        self._buffer.truncate()
        self._writer.writerow(values)
        return self._buffer.getvalue().encode()


_json = msgspec.json.Encoder()


async def export_lines(
    rows: AsyncIterator[UsageRow], fmt: Format, group_by: GroupBy | None = None
) -> AsyncIterator[bytes]:
    """The export of ``rows`` as encoded lines, each ending in a newline: CSV (header
    first, yielded before any row is read) or JSON Lines (one object per line, the same
    keys as the CSV columns). ``group_by`` None: one line per row, in input order; else one
    line per group (see ``GROUP_COLUMNS``)."""
    records: AsyncIterator[dict[str, Any]]
    if group_by is None:
        records, columns = _raw(rows), RAW_COLUMNS
    else:
        records, columns = _grouped(rows, group_by), GROUP_COLUMNS
    if fmt == "csv":
        line = _CsvLine()
        yield line(columns)
        async for record in records:
            yield line([_csv_value(record[c]) for c in columns])
    else:
        async for record in records:
            yield _json.encode(record) + b"\n"


async def _raw(rows: AsyncIterator[UsageRow]) -> AsyncIterator[dict[str, Any]]:
    async for row in rows:
        yield raw_record(row)


async def prime(rows: AsyncIterator[UsageRow]) -> AsyncIterator[UsageRow]:
    """Read the first row now, so a failing ledger (unreachable Redis) raises here, before a
    response has started, rather than breaking a stream that already sent its headers.
    Returns an iterator over all the rows, the first included."""
    first = await anext(rows, None)
    return _chain(first, rows)


async def _chain(first: UsageRow | None, rows: AsyncIterator[UsageRow]) -> AsyncIterator[UsageRow]:
    try:
        if first is None:
            return
        yield first
        async for row in rows:
            yield row
    finally:
        close = getattr(rows, "aclose", None)
        if close is not None:
            await close()
