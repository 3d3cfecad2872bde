"""The gateway's request series, computed from a hand-built ``RequestRecord``: retries vs
fallbacks, the gateway's own time, bounded labels (pure: no server, no clock)."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from core.config import parse_config
from core.config_observability import MetricsConfig
from core.errors import RateLimitError
from core.tenancy import Principal
from core.wire import make_usage
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.record import Phase, RequestRecord
from gateway.telemetry.series import TenantLabels, operation_of, status_class
from routers.trace import Attempt

CONFIG = parse_config(
    """
providers: {a: {type: openai, base_url: "http://127.0.0.1:9/v1"}}
models: {chat: {targets: [{provider: a, model: one}, {provider: a, model: two}]}}
"""
)


def record(**fields: object) -> RequestRecord:
    """A record as a request would leave it, with times relative to ``started = 100``."""
    request = SimpleNamespace(headers={}, scope={})
    rec = RequestRecord(request, "chat")  # type: ignore[arg-type]
    rec.started, rec.ended = 100.0, 101.0
    rec.model = "chat"
    rec.principal = Principal(tenant="acme", key_id="k1")
    for name, value in fields.items():
        setattr(rec, name, value)
    return rec


def value(metrics: GatewayMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_retry_then_a_fallback_are_told_apart():
    metrics, rec = GatewayMetrics(), record()
    rec.trace.attempts = [
        Attempt("a/one", "UpstreamServerError", 100.1, 100.2),
        Attempt("a/one", "UpstreamServerError", 100.3, 100.4),
        Attempt("a/two", None, 100.5, 100.8),
    ]
    rec.trace.served_by = SimpleNamespace(label="a/two", provider_name="a", model="two")
    rec.usage = make_usage(10, 5)
    metrics.request_done(rec, CONFIG, 200, None)
    assert (
        value(metrics, "switchyard_retries_total", target="a/one", reason="UpstreamServerError")
        == 1
    )
    fallback = {"model": "chat", "from_target": "a/one", "reason": "UpstreamServerError"}
    assert value(metrics, "switchyard_fallbacks_total", **fallback) == 1
    failed = {"gen_ai_provider_name": "a", "gen_ai_request_model": "one", "target": "a/one",
              "error_type": "UpstreamServerError"}  # fmt: skip
    assert value(metrics, "gen_ai_client_operation_duration_seconds_count", **failed) == 2
    # the gateway's own time: 1.0 s end to end minus 0.1 + 0.1 + 0.3 s upstream
    own = value(metrics, "switchyard_gateway_overhead_seconds_sum", endpoint="chat")
    assert abs(own - 0.5) < 1e-9
    tokens = {"tenant": "acme", "model": "chat", "target": "a/two"}
    assert value(metrics, "switchyard_tokens_total", **tokens, type="prompt") == 10
    assert value(metrics, "switchyard_tokens_total", **tokens, type="completion") == 5


def test_a_stream_reports_ttft_and_time_per_output_token():
    metrics = GatewayMetrics()
    rec = record(stream=True, ttft_s=0.2, usage=make_usage(3, 9))
    rec.trace.attempts = [Attempt("a/one", None, 100.05, 100.15)]
    rec.trace.served_by = SimpleNamespace(label="a/one", provider_name="a", model="one")
    metrics.request_done(rec, CONFIG, 200, None)
    labels = {"gen_ai_request_model": "chat", "gen_ai_provider_name": "a", "target": "a/one"}
    assert value(metrics, "gen_ai_server_time_to_first_token_seconds_sum", **labels) == 0.2
    tpot = value(metrics, "gen_ai_server_time_per_output_token_seconds_sum",
                 gen_ai_request_model="chat", target="a/one")  # fmt: skip
    assert abs(tpot - 0.8 / 8) < 1e-9  # (1.0 s - 0.2 s TTFT) over the 8 tokens after the first
    # a stream's own time ends at its first chunk: 0.2 s minus the 0.1 s upstream call
    own = value(metrics, "switchyard_gateway_overhead_seconds_sum", endpoint="chat")
    assert abs(own - 0.1) < 1e-9


def test_queue_wait_is_observed_only_for_requests_that_waited():
    metrics = GatewayMetrics()
    metrics.request_done(record(), CONFIG, 200, None)
    assert value(metrics, "switchyard_queue_wait_seconds_count", model="chat") == 0
    waited = record(phases=[Phase("queue.wait", 100.0, 100.25)])
    metrics.request_done(waited, CONFIG, 200, None)
    assert value(metrics, "switchyard_queue_wait_seconds_sum", model="chat") == 0.25


def test_refusals_are_counted_by_gate():
    metrics = GatewayMetrics()
    quota = RateLimitError("over")
    quota.refused_by = "quota:requests,tokens"
    full = RateLimitError("full")
    full.refused_by = "queue:full"
    metrics.request_done(record(), CONFIG, 429, quota)
    metrics.request_done(record(), CONFIG, 429, full)
    refused = {"tenant": "acme", "limit": "requests,tokens"}
    assert value(metrics, "switchyard_quota_rejections_total", **refused) == 1
    assert value(metrics, "switchyard_queue_rejections_total", reason="full") == 1
    errors = {"endpoint": "chat", "model": "chat", "error": "rate_limit_exceeded"}
    assert value(metrics, "switchyard_request_errors_total", **errors) == 2


def test_a_client_chosen_alias_is_not_a_label():
    metrics = GatewayMetrics()
    metrics.request_done(record(model="made-up-by-a-client"), CONFIG, 404, None)
    ok = {"endpoint": "chat", "model": "unknown", "provider": "", "target": "",
          "status_class": "4xx", "tenant": "acme"}  # fmt: skip
    assert value(metrics, "switchyard_requests_total", **ok) == 1


@given(st.lists(st.text(min_size=1, max_size=8), max_size=60), st.integers(1, 10))
def test_tenant_labels_never_exceed_the_cap(names: list[str], cap: int):
    labels, config = TenantLabels(), MetricsConfig(max_tenants=cap)
    seen = {labels.label(name, config) for name in names}
    assert len(seen - {TenantLabels.OTHER}) <= cap
    # a name that got its own label keeps it
    for name in names:
        given_label = labels.label(name, config)
        assert given_label in (name, TenantLabels.OTHER)


def test_tenant_label_off_and_no_tenant():
    labels = TenantLabels()
    assert labels.label("acme", MetricsConfig(tenant_label=False)) == ""
    assert labels.label(None, MetricsConfig()) == TenantLabels.NO_TENANT


def test_operations_and_status_classes():
    assert [operation_of(e) for e in ("chat", "messages", "completions", "embeddings")] == [
        "chat",
        "chat",
        "text_completion",
        "embeddings",
    ]
    assert [status_class(s) for s in (200, 499, 502)] == ["2xx", "4xx", "5xx"]
