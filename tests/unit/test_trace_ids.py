"""W3C trace context on arrival: a valid client ``traceparent`` is continued (its trace id,
its span as the parent, its sampled flag); anything else starts a new trace, sampled by
OpenTelemetry's trace-id ratio rule."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.telemetry.trace_ids import TraceIds, new_span_id, ratio_keeps

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
HEX16 = re.compile(r"^[0-9a-f]{16}$")
HEX32 = re.compile(r"^[0-9a-f]{32}$")


def test_a_valid_traceparent_is_continued():
    ids = TraceIds.for_request({"traceparent": f"00-{TRACE}-{PARENT}-01"}, 0.0)
    assert (ids.trace_id, ids.parent_span_id, ids.sampled) == (TRACE, PARENT, True)
    assert HEX16.match(ids.span_id) and ids.span_id != PARENT


def test_the_clients_unsampled_flag_wins_over_the_ratio():
    ids = TraceIds.for_request({"traceparent": f"00-{TRACE}-{PARENT}-00"}, 1.0)
    assert ids.trace_id == TRACE and not ids.sampled


def test_upper_case_and_surrounding_spaces_are_tolerated():
    header = f"  00-{TRACE.upper()}-{PARENT.upper()}-01 "
    ids = TraceIds.for_request({"traceparent": header}, 0.0)
    assert (ids.trace_id, ids.parent_span_id) == (TRACE, PARENT)


@pytest.mark.parametrize(
    "header",
    [
        f"00-{'0' * 32}-{PARENT}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
        f"01-{TRACE}-{PARENT}-01",  # unknown version
        f"00-{TRACE[:-1]}-{PARENT}-01",  # short trace id
        f"00-{TRACE}-{PARENT}-1",  # short flags
        f"00-{TRACE}-{PARENT}-01-extra",
        f"00-{TRACE[:-1]}g-{PARENT}-01",  # not hex
        "",
        "garbage",
    ],
)
def test_an_invalid_traceparent_starts_a_new_trace(header):
    ids = TraceIds.for_request({"traceparent": header}, 1.0)
    assert ids.parent_span_id is None and ids.trace_id != TRACE
    assert HEX32.match(ids.trace_id) and HEX16.match(ids.span_id)
    assert ids.sampled  # ratio 1: every new trace is sampled


def test_no_header_starts_a_new_trace_each_time():
    first, second = TraceIds.for_request({}, 1.0), TraceIds.for_request({}, 1.0)
    assert first.trace_id != second.trace_id and first.parent_span_id is None


def test_ratio_zero_samples_nothing_new():
    assert not any(TraceIds.for_request({}, 0.0).sampled for _ in range(200))


def test_the_upstream_header_names_the_given_span_and_keeps_the_flag():
    ids = TraceIds(TRACE, "1111111111111111", PARENT, sampled=False)
    assert ids.traceparent("2222222222222222") == f"00-{TRACE}-2222222222222222-00"
    sampled = TraceIds(TRACE, "1111111111111111", None, sampled=True)
    assert sampled.traceparent("2222222222222222").endswith("-01")


def test_ratio_rule_uses_the_low_64_bits():
    low = "0" * 16 + "0" * 15 + "1"  # low half = 1: below any positive ratio
    high = "0" * 16 + "f" * 16  # low half = 2^64 - 1: kept only at ratio 1
    assert ratio_keeps(low, 1e-9) and not ratio_keeps(low, 0.0)
    assert ratio_keeps(high, 1.0) and not ratio_keeps(high, 0.999)
    half = "f" * 16 + "7fffffffffffffff"  # the high half plays no part
    assert ratio_keeps(half, 0.5) and not ratio_keeps("0" * 16 + "8" + "0" * 15, 0.5)


@given(st.from_regex(HEX32, fullmatch=True), st.floats(0, 1))
def test_ratio_rule_is_deterministic_and_monotonic(trace_id, ratio):
    kept = ratio_keeps(trace_id, ratio)
    assert kept == ratio_keeps(trace_id, ratio)
    if kept:  # a trace kept at some ratio is kept at every higher one
        assert ratio_keeps(trace_id, min(1.0, ratio + 0.1))
    assert ratio_keeps(trace_id, 1.0)


def test_span_ids_are_16_hex_and_distinct():
    ids = {new_span_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(HEX16.match(i) for i in ids)
