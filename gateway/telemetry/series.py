"""Label rules and bucket boundaries shared by the gateway's metrics."""

from __future__ import annotations

from core.config_observability import MetricsConfig

# The GenAI semantic conventions' advice where they give one (TTFT, time per output
# token, operation duration, token usage), widened at the low end where the gateway's
# own figures live.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
)
TPOT_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
ATTEMPT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
DURATION_BUCKETS = (*ATTEMPT_BUCKETS, 163.84, 327.68)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# The gateway's own time is tens of microseconds to a few milliseconds: resolve it.
OVERHEAD_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.00075,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)
# fmt: on

_OPERATIONS = {
    "chat": "chat",
    "messages": "chat",
    "responses": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
}


def operation_of(endpoint: str) -> str:
    """The GenAI ``gen_ai.operation.name`` of an endpoint (its own name when none fits)."""
    return _OPERATIONS.get(endpoint, endpoint)


def status_class(status: int) -> str:
    return f"{status // 100}xx"


class TenantLabels:
    """The tenant label value: the name for the first ``max_tenants`` names seen, then
    ``other``; ``none`` for requests with no tenant (open access, refused before auth),
    and ``""`` for every request when ``tenant_label`` is off."""

    OTHER = "other"
    NO_TENANT = "none"

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def label(self, tenant: str | None, config: MetricsConfig) -> str:
        if not config.tenant_label:
            return ""
        if tenant is None:
            return self.NO_TENANT
        if tenant in self._seen:
            return tenant
        if len(self._seen) < config.max_tenants:
            self._seen.add(tenant)
            return tenant
        return self.OTHER
