"""The gateway's Prometheus series for finished requests (``GET /metrics``).

Names follow the OpenTelemetry GenAI semantic conventions where one exists (``gen_ai_*``,
the OTel-to-Prometheus spelling: dots become underscores, seconds get ``_seconds``), else
``switchyard_*``. Every series is documented in docs/metrics.md.

Everything here is computed once per request from its ``RequestRecord`` when the request
ends; what describes the process rather than a request (breakers, queue depth, replicas,
ledger, reloads) is read at scrape time by ``gateway.telemetry.state_metrics``.

Cardinality is bounded by construction: aliases that are not configured count as
``unknown`` (a client chooses the model name), tenants past ``max_tenants`` as ``other``
(a JWT can carry any tenant name), and every other label comes from the configuration or
from a fixed set of error names.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, generate_latest

from core.config import Config
from core.errors import GatewayError
from gateway.process.reload import Reloader
from gateway.process.state import GatewayState
from gateway.telemetry.families import Families
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.series import (
    ATTEMPT_BUCKETS,
    DURATION_BUCKETS,
    OVERHEAD_BUCKETS,
    QUEUE_BUCKETS,
    TOKEN_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    TenantLabels,
    operation_of,
    status_class,
)
from gateway.telemetry.state_metrics import StateCollector
from policies.admission import BATCH_NO_ROOM
from policies.idempotency import IdempotencyKeys
from routers.trace import Attempt

NONE = ""  # label value for "not applicable" (no tenant, no target)


class GatewayMetrics:
    """One registry per app (tests build several apps in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.tenants = TenantLabels()
        families = Families(self.registry)
        self.requests = families.counter(
            "switchyard_requests",
            "Requests answered, by endpoint, alias, serving provider and target, status class.",
            ["endpoint", "model", "provider", "target", "status_class", "tenant"],
        )
        self.errors = families.counter(
            "switchyard_request_errors",
            "Requests that ended in an error, by the error's code (or class).",
            ["endpoint", "model", "error"],
        )
        self.duration = families.histogram(
            "gen_ai_server_request_duration_seconds",
            "End-to-end request duration at the gateway (a stream: until its last event).",
            ["gen_ai_operation_name", "gen_ai_request_model", "stream"],
            DURATION_BUCKETS,
        )
        self.ttft = families.histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "Time from a streamed request's arrival to its first chunk sent to the client.",
            ["gen_ai_request_model", "gen_ai_provider_name", "target"],
            TTFT_BUCKETS,
        )
        self.tpot = families.histogram(
            "gen_ai_server_time_per_output_token_seconds",
            "A streamed request's decode time over its output tokens after the first.",
            ["gen_ai_request_model", "target"],
            TPOT_BUCKETS,
        )
        self.queue_wait = families.histogram(
            "switchyard_queue_wait_seconds",
            "Time a request waited in the admission queue (only requests that waited).",
            ["model"],
            QUEUE_BUCKETS,
        )
        self.attempt = families.histogram(
            "gen_ai_client_operation_duration_seconds",
            "One call to an upstream: to its whole answer, or to a stream's first chunk.",
            ["gen_ai_provider_name", "gen_ai_request_model", "target", "error_type"],
            ATTEMPT_BUCKETS,
        )
        self.overhead = families.histogram(
            "switchyard_gateway_overhead_seconds",
            "The gateway's own time in a successful request: until the answer (a stream: its "
            "first chunk) minus queue wait and the upstream calls.",
            ["endpoint"],
            OVERHEAD_BUCKETS,
        )
        self.token_usage = families.histogram(
            "gen_ai_client_token_usage",
            "Tokens per request as the serving upstream reported them.",
            ["gen_ai_provider_name", "gen_ai_request_model", "gen_ai_token_type"],
            TOKEN_BUCKETS,
        )
        self.tokens = families.counter(
            "switchyard_tokens",
            "Tokens billed, by tenant, alias, target and type (prompt, completion, cached, "
            "reasoning; cached is within prompt, reasoning within completion).",
            ["tenant", "model", "target", "type"],
        )
        self.cost = families.counter(
            "switchyard_cost_usd",
            "Cost in USD at the serving target's price, as billed to the tenant.",
            ["tenant", "model", "target"],
        )
        self.hedge_cost = families.counter(
            "switchyard_hedge_cost_usd",
            "What hedge races' losers likely cost (their prompt; the operator's, not billed).",
            ["model", "target"],
        )
        self.fallbacks = families.counter(
            "switchyard_fallbacks",
            "Targets given up on for the next one, by the error that made the gateway move.",
            ["model", "from_target", "reason"],
        )
        self.retries = families.counter(
            "switchyard_retries",
            "Repeated calls to the same target, by the error that was retried.",
            ["target", "reason"],
        )
        self.hedges = families.counter(
            "switchyard_hedges",
            "Hedge races, by the racer that served (first or second target).",
            ["model", "winner"],
        )
        self.cache_hits = families.counter(
            "switchyard_response_cache_hits",
            "Requests answered from the response cache.",
            ["model", "tenant"],
        )
        self.prompt_cache_hits = families.counter(
            "switchyard_prompt_cache_hits",
            "Requests whose upstream reported cached prompt tokens.",
            ["target"],
        )
        self.quota_rejections = families.counter(
            "switchyard_quota_rejections",
            "Requests refused by a quota, by the limits that did not fit (or store_down).",
            ["tenant", "limit"],
        )
        self.queue_rejections = families.counter(
            "switchyard_queue_rejections",
            "Requests the admission queue refused (full) or gave up on (deadline).",
            ["reason"],
        )
        self.goodput = families.counter(
            "switchyard_goodput_requests",
            "Routed requests by whether they met their TTFT objective (met, missed, none).",
            ["model", "slo"],
        )

    def watch(
        self,
        state: GatewayState,
        reloader: Reloader | None,
        idempotency: Callable[[], IdempotencyKeys | None] = lambda: None,
    ) -> None:
        """Also report ``state``, reloads and idempotency keys at scrape time (the app
        calls this once)."""
        self.registry.register(StateCollector(state, reloader, idempotency))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def request_done(
        self, record: RequestRecord, config: Config, status: int, error: GatewayError | None
    ) -> None:
        """Count one finished request (called once, after its ledger row and log line).
        A batch item put back for lack of room is not one: it counts as a queue refusal
        (``batch_no_room``) and runs again later."""
        if error is not None and error.refused_by == BATCH_NO_ROOM:
            self._refusal(error, NONE)
            return
        settings = config.observability.metrics
        tenant = self.tenants.label(record.principal.tenant, settings)
        model = record.model if record.model in config.models else "unknown"
        if record.model is None:
            model = NONE
        served = record.trace.served_by
        target = served.label if served is not None else NONE
        provider = served.provider_name if served is not None else NONE
        self.requests.labels(
            record.endpoint, model, provider, target, status_class(status), tenant
        ).inc()
        if status >= 400:
            name = (error.code or type(error).__name__) if error else "client_closed"
            self.errors.labels(record.endpoint, model, name).inc()
            self._refusal(error, tenant)
        self._durations(record, model, provider, target, status)
        self._attempts(record, model)
        if served is not None:
            self._usage(record, tenant, model, provider, target)
        if record.cache_hit:
            self.cache_hits.labels(model, tenant).inc()
        if record.slo_met is not None or (record.trace.attempts and status == 200):
            slo = "none" if record.slo_met is None else ("met" if record.slo_met else "missed")
            self.goodput.labels(model, slo).inc()

    def _refusal(self, error: GatewayError | None, tenant: str) -> None:
        gate = error.refused_by if error is not None else None
        if gate is None:
            return
        kind, _, detail = gate.partition(":")
        if kind == "quota":
            self.quota_rejections.labels(tenant, detail).inc()
        elif kind == "queue":
            self.queue_rejections.labels(detail).inc()

    def _durations(
        self, record: RequestRecord, model: str, provider: str, target: str, status: int
    ) -> None:
        ended = record.ended if record.ended is not None else record.started
        total = ended - record.started
        operation = operation_of(record.endpoint)
        self.duration.labels(operation, model, "true" if record.stream else "false").observe(total)
        queue = next((p.end - p.start for p in record.phases if p.name == "queue.wait"), None)
        if queue is not None:
            self.queue_wait.labels(model).observe(queue)
        if record.stream and record.ttft_s is not None and target:
            self.ttft.labels(model, provider, target).observe(record.ttft_s)
            usage = record.usage
            if usage is not None and usage.completion_tokens > 1:
                decode = max(0.0, total - record.ttft_s)
                self.tpot.labels(model, target).observe(decode / (usage.completion_tokens - 1))
        if status == 200:
            answered = record.ttft_s if record.stream and record.ttft_s is not None else total
            upstream = sum(a.ended - a.started for a in record.trace.attempts)
            own = answered - (queue or 0.0) - upstream
            self.overhead.labels(record.endpoint).observe(max(0.0, own))

    def _attempts(self, record: RequestRecord, model: str) -> None:
        """Per attempt: its upstream latency; a repeat of the previous target is a retry,
        a move to another target after a failure a fallback."""
        trace = record.trace
        previous: Attempt | None = None
        for attempt in trace.attempts:
            provider, _, upstream_model = attempt.label.partition("/")  # label: provider/model
            self.attempt.labels(
                provider, upstream_model, attempt.label, attempt.error or NONE
            ).observe(max(0.0, attempt.ended - attempt.started))
            if previous is not None and previous.error is not None:
                if previous.label == attempt.label:
                    self.retries.labels(attempt.label, previous.error).inc()
                else:
                    self.fallbacks.labels(model, previous.label, previous.error).inc()
            previous = attempt
        if trace.hedge is not None and trace.served_by is not None:
            winner = "first" if trace.served_by.label == trace.hedge[0].label else "second"
            self.hedges.labels(model, winner).inc()
            loser = trace.hedge_loser
            if loser is not None and record.hedge_cost_usd:
                self.hedge_cost.labels(model, loser.label).inc(record.hedge_cost_usd)

    def _usage(
        self, record: RequestRecord, tenant: str, model: str, provider: str, target: str
    ) -> None:
        usage = record.usage
        if record.cost_usd:
            self.cost.labels(tenant, model, target).inc(record.cost_usd)
        if usage is None or record.cache_hit:
            return
        served = record.trace.served_by
        upstream_model = served.model if served is not None else NONE
        self.token_usage.labels(provider, upstream_model, "input").observe(usage.prompt_tokens)
        self.token_usage.labels(provider, upstream_model, "output").observe(usage.completion_tokens)
        counts = (
            ("prompt", usage.prompt_tokens),
            ("completion", usage.completion_tokens),
            ("cached", usage.cached_tokens or 0),
            ("reasoning", usage.reasoning_tokens or 0),
        )
        for kind, count in counts:
            if count:
                self.tokens.labels(tenant, model, target, kind).inc(count)
        if usage.cached_tokens:
            self.prompt_cache_hits.labels(target).inc()
