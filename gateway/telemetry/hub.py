"""Where a finished request becomes metrics and a trace.

The request's path only records facts (``RequestRecord``: timings, phases, the routing
trace, usage); this module turns them into Prometheus series and OpenTelemetry spans once,
when the request ends, so the hot path carries no instrumentation calls of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import structlog

from core.config import Config
from core.config_observability import TracingConfig
from core.errors import GatewayError
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.recent import RecentRequests
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.trace_ids import TraceIds

if TYPE_CHECKING:
    from gateway.telemetry.tracing import Tracing

_log = structlog.get_logger("switchyard")


class Telemetry:
    """The process's metrics registry and (when configured) its trace exporter."""

    def __init__(self, config: Config) -> None:
        self.metrics = GatewayMetrics()
        self.recent = RecentRequests()  # the admin console's live tail and timelines
        self.tracing: Tracing | None = None
        self._tracing_config = TracingConfig()
        self._redact: Sequence[str] = ()
        self.configure(config.observability.tracing, config.observability.redact)

    def configure(self, tracing: TracingConfig, redact: Sequence[str] = ()) -> None:
        """Apply a (re)loaded ``observability.tracing`` (and ``redact``, the patterns for
        captured content): a change replaces the exporter (the old one flushes what it
        holds in the background: this may run on the event loop)."""
        current, self._tracing_config = self._tracing_config, tracing
        patterns, self._redact = self._redact, redact
        if tracing == current and list(redact) == list(patterns):
            return
        old, self.tracing = self.tracing, _tracing(tracing, redact) if tracing.enabled else None
        if old is not None:
            old.shutdown(timeout_s=0)

    def started(self, record: RequestRecord, headers: Mapping[str, str], config: Config) -> None:
        """Decide the request's trace ids (continuing the client's ``traceparent``).
        ``config``: the request's snapshot; a reload that changed tracing applies here."""
        observability = config.observability
        if observability.tracing is not self._tracing_config or (
            observability.redact is not self._redact
        ):
            self.configure(observability.tracing, observability.redact)
        if self.tracing is not None:
            record.trace_ids = TraceIds.for_request(headers, self.tracing.config.sample_ratio)
            record.capture_content = self.tracing.config.capture_content

    def finished(
        self, record: RequestRecord, config: Config, status: int, error: GatewayError | None
    ) -> None:
        """Keep the request for the console, count it and export its trace. Never raises:
        observability must not fail a request that has already been answered."""
        try:
            self.recent.add(record, status, error)
            if config.observability.metrics.enabled:
                self.metrics.request_done(record, config, status, error)
            if self.tracing is not None and record.trace_ids is not None:
                self.tracing.export(record, status, error)
        except Exception:
            _log.exception("telemetry.failed", request_id=record.request_id)

    def shutdown(self) -> None:
        if self.tracing is not None:
            self.tracing.shutdown()


def _tracing(config: TracingConfig, redact: Sequence[str]) -> Tracing:
    """The exporter; imported here so a gateway without tracing never loads the SDK."""
    from gateway.process.redact import Redactor
    from gateway.telemetry.tracing import Tracing

    return Tracing(config, Redactor(redact))
