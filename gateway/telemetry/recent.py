"""What the admin console shows of recent traffic, kept in this process's memory: the last
requests (the facts of their ``request.completed`` lines, never prompt or answer content)
and per-minute totals with latency and TTFT histograms, overall and per tenant.

Fed by ``Telemetry.finished`` once per request, right after the log line is written. Both
are bounded: ``capacity`` requests, and ``keep_minutes`` of minutes (older minutes are
dropped as time moves on). Percentiles come from histograms with 8 buckets per doubling
(a reported value is the upper edge of its bucket, at most 12.5% above the true one); they
merge exactly across minutes.

``add`` runs once per request on the event loop, so it only counts and keeps references
(about 3 us per request; the rows the console shows are built when it reads them).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from core.errors import GatewayError
    from gateway.telemetry.record import RequestRecord

BUCKETS_PER_DOUBLING = 8
MINUTE_S = 60.0


class RecentRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One finished request as the console lists it. ``ts`` is when it ended (Unix
    seconds); ``route_reason`` says why it went where it went."""

    seq: int
    ts: float
    request_id: str
    tenant: str | None
    key_id: str | None
    model: str | None
    provider: str | None
    upstream_model: str | None
    endpoint: str
    stream: bool
    status: int
    error: str | None
    attempts: int
    fallbacks: int
    latency_ms: float
    ttft_ms: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cost_usd: float
    cache_hit: bool
    route_reason: str


def bucket_of(ms: float) -> int:
    """The histogram bucket of ``ms``: bucket ``8k + s`` holds [2**k * (1 + s/8),
    2**k * (1 + (s+1)/8)); everything below 1 ms is bucket 0."""
    if ms < 1.0:
        return 0
    mantissa, exponent = math.frexp(ms)  # ms = mantissa * 2**exponent, 0.5 <= mantissa < 1
    return (exponent - 1) * BUCKETS_PER_DOUBLING + int(
        (mantissa * 2.0 - 1.0) * BUCKETS_PER_DOUBLING
    )


def bucket_edge(index: int) -> float:
    """The upper edge (ms) of bucket ``index``: what a percentile falling in it reports."""
    octave, step = divmod(index, BUCKETS_PER_DOUBLING)
    return float(2.0**octave * (1.0 + (step + 1) / BUCKETS_PER_DOUBLING))


def quantile(histogram: dict[int, int], q: float) -> float | None:
    """The ``q`` quantile (0 < q <= 1) of a bucket histogram, as its bucket's upper edge;
    None when it is empty."""
    total = sum(histogram.values())
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index in sorted(histogram):
        seen += histogram[index]
        if seen >= rank:
            return bucket_edge(index)
    return bucket_edge(max(histogram))  # pragma: no cover - rank <= total always stops above


class Minute:
    """Totals of the requests that ended within one minute."""

    __slots__ = ("cost_usd", "errors", "latency", "requests", "tokens", "ttft")

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.tokens = 0
        self.cost_usd = 0.0
        self.latency: dict[int, int] = {}
        self.ttft: dict[int, int] = {}

    def count(
        self, status: int, tokens: int, cost_usd: float, latency_ms: float, ttft_ms: float | None
    ) -> None:
        self.requests += 1
        if status >= 400:
            self.errors += 1
        self.tokens += tokens
        self.cost_usd += cost_usd
        bucket = bucket_of(latency_ms)
        self.latency[bucket] = self.latency.get(bucket, 0) + 1
        if ttft_ms is not None:
            bucket = bucket_of(ttft_ms)
            self.ttft[bucket] = self.ttft.get(bucket, 0) + 1

    def merge(self, other: Minute) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.tokens += other.tokens
        self.cost_usd += other.cost_usd
        for mine, theirs in ((self.latency, other.latency), (self.ttft, other.ttft)):
            for index, count in theirs.items():
                mine[index] = mine.get(index, 0) + count


class Point(msgspec.Struct, frozen=True, kw_only=True):
    """One step of a chart: the requests that ended in [t, t + step_s)."""

    t: float
    requests: int
    errors: int
    tokens: int
    cost_usd: float
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None


def point_of(t: float, minute: Minute) -> Point:
    """``minute``'s totals and percentiles as the point at ``t``."""
    return Point(
        t=t,
        requests=minute.requests,
        errors=minute.errors,
        tokens=minute.tokens,
        cost_usd=minute.cost_usd,
        latency_p50_ms=quantile(minute.latency, 0.50),
        latency_p95_ms=quantile(minute.latency, 0.95),
        latency_p99_ms=quantile(minute.latency, 0.99),
        ttft_p50_ms=quantile(minute.ttft, 0.50),
        ttft_p95_ms=quantile(minute.ttft, 0.95),
    )


class Timeline:
    """Per-minute totals (keyed by the minute's start, Unix seconds)."""

    def __init__(self) -> None:
        self.minutes: dict[float, Minute] = {}

    def minute(self, start: float) -> Minute:
        """The totals of the minute starting at ``start`` (created empty)."""
        minute = self.minutes.get(start)
        if minute is None:
            minute = self.minutes[start] = Minute()
        return minute

    def drop_before(self, start: float) -> None:
        for key in [k for k in self.minutes if k < start]:
            del self.minutes[key]

    def series(self, now: float, span_s: float, step_s: float) -> list[Point]:
        """Points every ``step_s`` (a multiple of a minute) covering the ``span_s`` seconds
        up to ``now``, oldest first; steps without traffic are zero points."""
        steps = max(1, round(span_s / step_s))
        last = math.floor(now / step_s) * step_s
        first = last - (steps - 1) * step_s
        merged = {first + i * step_s: Minute() for i in range(steps)}
        for start, minute in self.minutes.items():
            slot = math.floor(start / step_s) * step_s
            target = merged.get(slot)
            if target is not None:
                target.merge(minute)
        return [point_of(t, minute) for t, minute in merged.items()]


class _Kept:
    """What ``add`` keeps of a finished request: numbers, and references to its record's
    parts (never its captured content); the row is built when the console shows it."""

    __slots__ = (
        "cache_hit", "cost_usd", "endpoint", "error", "latency_ms", "model", "principal",
        "request_id", "seq", "status", "stream", "trace", "ts", "ttft_ms", "usage",
    )  # fmt: skip

    def __init__(self, seq: int, ts: float, record: RequestRecord, status: int,
                 error: str | None, latency_ms: float, ttft_ms: float | None) -> None:  # fmt: skip
        self.seq, self.ts, self.status, self.error = seq, ts, status, error
        self.latency_ms, self.ttft_ms = latency_ms, ttft_ms
        self.request_id = record.request_id
        self.principal = record.principal
        self.model = record.model
        self.endpoint = record.endpoint
        self.stream = record.stream
        self.trace = record.trace
        self.usage = record.usage
        self.cost_usd = record.cost_usd
        self.cache_hit = record.cache_hit

    def view(self) -> RecentRequest:
        served = self.trace.served_by
        usage = self.usage
        return RecentRequest(
            seq=self.seq,
            ts=self.ts,
            request_id=self.request_id,
            tenant=self.principal.tenant,
            key_id=self.principal.key_id,
            model=self.model,
            provider=served.provider_name if served else None,
            upstream_model=served.model if served else None,
            endpoint=self.endpoint,
            stream=self.stream,
            status=self.status,
            error=self.error,
            attempts=len(self.trace.attempts),
            fallbacks=self.trace.fallbacks,
            latency_ms=round(self.latency_ms, 2),
            ttft_ms=round(self.ttft_ms, 2) if self.ttft_ms is not None else None,
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            cost_usd=self.cost_usd,
            cache_hit=self.cache_hit,
            route_reason=self.trace.route_reason() if self.model else "",
        )


class RecentRequests:
    """The last ``capacity`` requests and ``keep_minutes`` of per-minute timelines (the
    whole gateway's, and each tenant's)."""

    def __init__(self, capacity: int = 1000, keep_minutes: int = 360) -> None:
        self._items: deque[_Kept] = deque(maxlen=capacity)
        self._keep_s = keep_minutes * MINUTE_S
        self.total = Timeline()
        self.by_tenant: dict[str, Timeline] = {}
        self._seq = 0
        self._current_minute = -math.inf

    def add(self, record: RequestRecord, status: int, error: GatewayError | None) -> None:
        """Keep a finished request (after its ``request.completed`` line)."""
        duration = (record.ended if record.ended is not None else record.started) - record.started
        ended = record.wall_started + duration
        latency_ms = duration * 1000.0
        ttft_ms = record.ttft_s * 1000.0 if record.ttft_s is not None else None
        self._seq += 1
        code = (error.code or type(error).__name__) if error else None
        self._items.append(_Kept(self._seq, ended, record, status, code, latency_ms, ttft_ms))
        usage = record.usage
        tokens = usage.prompt_tokens + usage.completion_tokens if usage else 0
        start = ended // MINUTE_S * MINUTE_S
        self.total.minute(start).count(status, tokens, record.cost_usd, latency_ms, ttft_ms)
        tenant = record.principal.tenant
        if tenant is not None:
            timeline = self.by_tenant.get(tenant)
            if timeline is None:
                timeline = self.by_tenant[tenant] = Timeline()
            timeline.minute(start).count(status, tokens, record.cost_usd, latency_ms, ttft_ms)
        self._rolled(start)

    def _rolled(self, minute: float) -> None:
        if minute > self._current_minute:  # once a minute: forget what is too old
            self._current_minute = minute
            self._prune(minute - self._keep_s)

    def _prune(self, before: float) -> None:
        self.total.drop_before(before)
        for tenant in list(self.by_tenant):
            timeline = self.by_tenant[tenant]
            timeline.drop_before(before)
            if not timeline.minutes:
                del self.by_tenant[tenant]

    def timeline(self, tenant: str | None) -> Timeline:
        """The whole gateway's timeline (``tenant`` None) or one tenant's (empty if none)."""
        if tenant is None:
            return self.total
        return self.by_tenant.get(tenant) or Timeline()

    def tail(
        self,
        *,
        tenant: str | None = None,
        model: str | None = None,
        status: str | None = None,
        limit: int = 100,
    ) -> list[RecentRequest]:
        """The newest ``limit`` requests matching every filter given, newest first.
        ``status``: ``ok`` (below 400), ``error`` (400 and above) or one status code;
        ``StatusFilterError`` for anything else."""
        wanted = _status_filter(status)
        found: list[RecentRequest] = []
        for kept in reversed(self._items):
            if tenant is not None and kept.principal.tenant != tenant:
                continue
            if model is not None and kept.model != model:
                continue
            if wanted is not None and not wanted(kept.status):
                continue
            found.append(kept.view())  # rows are built only for what is shown
            if len(found) >= limit:
                break
        return found

    def __len__(self) -> int:
        return len(self._items)


class StatusFilterError(ValueError):
    """A status filter that is neither ``ok``, ``error`` nor a status code."""


def _status_filter(status: str | None) -> Callable[[int], bool] | None:
    if status is None or status == "":
        return None
    if status == "ok":
        return lambda code: code < 400
    if status == "error":
        return lambda code: code >= 400
    if status.isdigit() and len(status) == 3:
        wanted = int(status)
        return lambda code: code == wanted
    raise StatusFilterError(f"status must be ok, error or a 3-digit code; got {status[:16]!r}")
