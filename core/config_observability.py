"""The ``observability:`` section: Prometheus metrics and OpenTelemetry traces."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

Ratio = Annotated[float, Meta(ge=0, le=1)]


class MetricsConfig(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``GET /metrics`` in Prometheus' text format.

    ``tenant_label``: label per-tenant series (requests, tokens, cost, quota rejections)
    with the tenant's name; the first ``max_tenants`` distinct names seen get their own
    label, the rest share ``other`` so a client minting tenant names (JWT claims) cannot
    explode the series count. ``require_admin``: the scrape must carry the admin key."""

    enabled: bool = True
    tenant_label: bool = True
    max_tenants: Annotated[int, Meta(ge=1)] = 100
    require_admin: bool = False


class TracingConfig(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """OpenTelemetry traces over OTLP/HTTP; off unless ``endpoint`` is set.

    ``sample_ratio``: the share of traces kept (by trace id, so a client's sampled
    ``traceparent`` is honoured); ``always_on_errors`` keeps every trace that ended in an
    error. ``capture_content`` puts prompts and completions in spans, after redaction
    (``ObservabilityConfig.redact``)."""

    endpoint: str | None = None  # e.g. http://127.0.0.1:4318/v1/traces
    service_name: str = "switchyard"
    sample_ratio: Ratio = 1.0
    always_on_errors: bool = True
    capture_content: bool = False
    headers: dict[str, str] = {}  # sent with every export (e.g. an auth token)

    @property
    def enabled(self) -> bool:
        return self.endpoint is not None


class ObservabilityConfig(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``redact``: regular expressions whose matches are replaced in log lines and span
    attributes, on top of the built-in patterns (e-mail addresses, API-key-like strings)."""

    metrics: MetricsConfig = MetricsConfig()
    tracing: TracingConfig = TracingConfig()
    redact: list[str] = []
