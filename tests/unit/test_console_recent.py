"""The console's in-memory traffic record (gateway/telemetry/recent.py): the bounded live
tail and its filters, per-minute timelines (overall and per tenant) and their pruning, the
histogram percentiles (never below the true value, at most one bucket above), and what it
keeps of a ``RequestRecord`` (never content)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from litestar import Request

from core.tenancy import Principal
from core.wire import make_usage
from gateway.console.timeline import chart_data, range_of, summary
from gateway.telemetry.recent import (
    BUCKETS_PER_DOUBLING,
    MINUTE_S,
    RecentRequests,
    StatusFilterError,
    Timeline,
    bucket_edge,
    bucket_of,
    quantile,
)
from gateway.telemetry.record import RequestRecord

T0 = 1_700_000_040.0  # a minute boundary
RATIO = 1 + 1 / BUCKETS_PER_DOUBLING  # the widest bucket's upper edge over its lower one


def _request() -> Request[Any, Any, Any]:
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [],
             "query_string": b"", "app": None, "state": {}}  # fmt: skip
    return Request(scope)  # type: ignore[arg-type]


def finished(
    ts: float,
    *,
    tenant: str | None = "acme",
    model: str | None = "chat",
    latency_ms: float = 100.0,
    ttft_ms: float | None = 50.0,
    cost_usd: float = 0.001,
) -> RequestRecord:
    """A real request record that ended at Unix time ``ts`` (its log line written)."""
    record = RequestRecord(_request(), "chat")
    if tenant is not None:
        record.principal = Principal(tenant=tenant, key_id="k1", via="api_key")
    record.model = model
    record.usage = make_usage(10, 5)
    record.cost_usd = cost_usd
    record.ttft_s = ttft_ms / 1000 if ttft_ms is not None else None
    record.finish(200)
    record.started, record.ended = 100.0, 100.0 + latency_ms / 1000
    record.wall_started = ts - latency_ms / 1000
    return record


def feed(recent: RecentRequests, ts: float, status: int = 200, **fields: Any) -> None:
    recent.add(finished(ts, **fields), status, None)


def count(timeline: Timeline, ts: float, status: int = 200, latency_ms: float = 100.0,
          ttft_ms: float | None = 50.0) -> None:  # fmt: skip
    timeline.minute(ts // MINUTE_S * MINUTE_S).count(status, 15, 0.001, latency_ms, ttft_ms)


def test_the_tail_is_newest_first_and_bounded() -> None:
    recent = RecentRequests(capacity=3)
    for seq in range(1, 6):
        feed(recent, T0 + seq)
    assert len(recent) == 3
    assert [i.seq for i in recent.tail()] == [5, 4, 3]
    assert [i.seq for i in recent.tail(limit=2)] == [5, 4]


def test_the_tail_filters_by_tenant_alias_and_status() -> None:
    recent = RecentRequests()
    feed(recent, T0, tenant="acme", model="chat", status=200)
    feed(recent, T0, tenant="globex", model="chat", status=429)
    feed(recent, T0, tenant="acme", model="embed", status=502)
    feed(recent, T0, tenant=None, model="chat", status=404)
    assert [i.seq for i in recent.tail(tenant="acme")] == [3, 1]
    assert [i.seq for i in recent.tail(model="chat")] == [4, 2, 1]
    assert [i.seq for i in recent.tail(status="ok")] == [1]
    assert [i.seq for i in recent.tail(status="error")] == [4, 3, 2]
    assert [i.seq for i in recent.tail(status="429")] == [2]
    assert [i.seq for i in recent.tail(tenant="acme", status="error")] == [3]
    assert recent.tail(tenant="initech") == []


@pytest.mark.parametrize("bad", ["oops", "20", "2000", "4xx", "-12"])
def test_a_bad_status_filter_is_refused(bad: str) -> None:
    with pytest.raises(StatusFilterError, match="status must be ok, error or a 3-digit code"):
        RecentRequests().tail(status=bad)


def test_timelines_sum_each_minute_overall_and_per_tenant() -> None:
    recent = RecentRequests()
    feed(recent, T0 + 1, cost_usd=0.5, status=200)
    feed(recent, T0 + 59, cost_usd=0.25, status=500, tenant="globex")
    feed(recent, T0 + 61, cost_usd=1.0)
    points = recent.timeline(None).series(T0 + 61, 3 * MINUTE_S, MINUTE_S)
    assert [p.t for p in points] == [T0 - 60, T0, T0 + 60]
    assert [p.requests for p in points] == [0, 2, 1]
    assert [p.errors for p in points] == [0, 1, 0]
    assert [p.cost_usd for p in points] == [0.0, 0.75, 1.0]
    assert [p.tokens for p in points] == [0, 30, 15]
    acme = recent.timeline("acme").series(T0 + 61, 2 * MINUTE_S, MINUTE_S)
    assert [p.requests for p in acme] == [1, 1]
    assert recent.timeline("nobody").minutes == {}


def test_a_wider_step_merges_minutes_and_their_histograms() -> None:
    start = 1_700_000_100.0  # a 5-minute boundary
    timeline = Timeline()
    for minute in range(5):
        count(timeline, start + minute * 60 + 1, latency_ms=10.0 * (minute + 1))
    (point,) = timeline.series(start + 4 * 60, 300.0, 300.0)
    assert (point.t, point.requests) == (start, 5)
    assert point.latency_p50_ms == bucket_edge(bucket_of(30.0))
    assert point.latency_p99_ms == bucket_edge(bucket_of(50.0))


def test_old_minutes_are_forgotten_and_idle_tenants_dropped() -> None:
    recent = RecentRequests(keep_minutes=10)
    feed(recent, T0 + 1, tenant="globex")
    feed(recent, T0 + 11 * 60 + 1, tenant="acme")
    assert sorted(recent.total.minutes) == [T0 + 11 * 60]
    assert set(recent.by_tenant) == {"acme"}


def test_percentiles_of_an_empty_minute_are_none() -> None:
    (point,) = Timeline().series(T0, MINUTE_S, MINUTE_S)
    assert point.requests == 0 and point.latency_p50_ms is None and point.ttft_p95_ms is None


def test_buckets_have_8_steps_per_doubling() -> None:
    assert bucket_of(0.2) == bucket_of(1.0) == 0 and bucket_edge(0) == 1.125
    assert bucket_of(2.0) == BUCKETS_PER_DOUBLING and bucket_edge(8) == 2.25
    assert bucket_of(3.9) == 15 and bucket_edge(15) == 4.0
    assert bucket_edge(bucket_of(1000.0)) == 1024.0


@given(
    st.lists(st.floats(min_value=1.0, max_value=600_000.0), min_size=1, max_size=200),
    st.sampled_from([0.5, 0.95, 0.99]),
)
def test_a_percentile_is_never_below_the_truth_nor_a_bucket_above(
    values: list[float], q: float
) -> None:
    histogram: dict[int, int] = {}
    for value in values:
        histogram[bucket_of(value)] = histogram.get(bucket_of(value), 0) + 1
    truth = sorted(values)[max(0, math.ceil(q * len(values)) - 1)]  # nearest rank
    reported = quantile(histogram, q)
    assert reported is not None
    assert truth < reported <= truth * RATIO * (1 + 1e-12)


def test_the_overview_summary_covers_the_range_up_to_now() -> None:
    timeline = Timeline()
    count(timeline, T0 - 3600, latency_ms=5.0)  # outside the last hour
    count(timeline, T0 - 3000, latency_ms=100.0, status=503)
    count(timeline, T0 + 30, latency_ms=200.0, ttft_ms=None)
    total = summary(timeline, T0 + 30, 3600.0)
    assert (total.requests, total.errors) == (2, 1)
    assert total.latency_p50_ms == bucket_edge(bucket_of(100.0))
    assert total.ttft_p50_ms == bucket_edge(bucket_of(50.0))  # only one had a TTFT
    body = chart_data(timeline, T0 + 30, "6h")
    assert body["step_s"] == 300.0 and len(body["points"]) == 72
    assert sum(p["requests"] for p in body["points"]) == 3


def test_an_unknown_range_is_a_400_naming_range() -> None:
    with pytest.raises(Exception, match="range must be one of 15m, 1h, 6h") as info:
        range_of("2d")
    assert getattr(info.value, "param", None) == "range"


def test_it_keeps_the_facts_of_a_finished_request_and_no_content() -> None:
    record = finished(T0 + 5, tenant="acme", model="chat", cost_usd=0.002)
    record.principal = Principal(tenant="acme", key_id="k9", via="api_key")
    record.content_in = "a secret prompt"
    recent = RecentRequests()
    recent.add(record, 200, None)
    (kept,) = recent.tail()
    assert (kept.request_id, kept.tenant, kept.key_id, kept.model) == (
        record.request_id, "acme", "k9", "chat",
    )  # fmt: skip
    assert (kept.prompt_tokens, kept.completion_tokens, kept.cost_usd) == (10, 5, 0.002)
    assert kept.ttft_ms == 50.0 and kept.latency_ms == 100.0
    assert kept.route_reason == "no target succeeded"
    assert "secret" not in repr(kept)
    assert recent.timeline("acme").minutes
