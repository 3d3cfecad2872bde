"""The ids of one request's trace (W3C Trace Context), decided when the request arrives.

The request's span id and every attempt's span id are chosen here, before the spans are
built, so the ``traceparent`` sent upstream names the attempt span that will be exported
when the request ends (``gateway.process.tracing`` builds the spans from the record).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from msgspec import Struct

# version 00: trace id (32 hex), parent id (16 hex), flags (2 hex); all-zero ids invalid
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
_RATIO_SPACE = 1 << 64


def new_span_id() -> str:
    return os.urandom(8).hex()


class TraceIds(Struct, frozen=True):
    """``trace_id``/``span_id`` of the request span; ``parent_span_id``: the client's span
    (from its ``traceparent``), else None; ``sampled``: the head decision (the client's
    flag when it sent one, else ``sample_ratio`` by trace id)."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    sampled: bool

    @classmethod
    def for_request(cls, headers: Mapping[str, str], sample_ratio: float) -> TraceIds:
        """Continue the client's trace when its ``traceparent`` is valid, else start one."""
        match = _TRACEPARENT.match(headers.get("traceparent", "").strip().lower())
        if match and match.group(1) != _ZERO_TRACE and match.group(2) != _ZERO_SPAN:
            trace_id, parent = match.group(1), match.group(2)
            sampled = bool(int(match.group(3), 16) & 1)
            return cls(trace_id, new_span_id(), parent, sampled)
        trace_id = os.urandom(16).hex()
        return cls(trace_id, new_span_id(), None, ratio_keeps(trace_id, sample_ratio))

    def traceparent(self, span_id: str) -> str:
        """The header naming ``span_id`` (a span of this trace) as the parent."""
        return f"00-{self.trace_id}-{span_id}-{'01' if self.sampled else '00'}"


def ratio_keeps(trace_id: str, ratio: float) -> bool:
    """OpenTelemetry's TraceIdRatioBased rule: keep when the low 64 bits of the trace id
    are below ``ratio`` of their range (the same trace id gets the same answer anywhere)."""
    return int(trace_id[16:], 16) < int(ratio * _RATIO_SPACE)
