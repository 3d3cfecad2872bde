"""The worker's ``/metrics``: vLLM's metric names, so scrapers and the gateway's capacity
signals read a JAX worker and a vLLM worker alike.

Engine-wide gauges and counters are read from ``engine.stats()`` at scrape time (one source
of truth, no double counting); latency histograms are observed per request by ``timed()``.
Every series carries ``engine="0"`` and ``model_name`` like vLLM's; ``vllm:cache_config_info``
carries the KV cache geometry as labels with the value 1.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from local_tier.jax.api import EngineStats, GenerationOutput
from local_tier.serving import owned

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py), so dashboards line up.
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
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
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
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)

StatsFn = Callable[[], EngineStats | None]
LABELS = ["engine", "model_name"]
ENGINE = "0"  # one engine per worker process, like a vLLM server without data parallelism

_GAUGES = (
    (
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        "num_requests_running",
    ),
    (
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        "num_requests_waiting",
    ),
    (
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        "kv_cache_usage_perc",
    ),
)
_COUNTERS = (
    (
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        "prefix_cache_queries_total",
    ),
    (
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        "prefix_cache_hits_total",
    ),
    ("vllm:prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens_total"),
    ("vllm:generation_tokens", "Number of generation tokens processed.", "generation_tokens_total"),
    (
        "vllm:num_preemptions",
        "Cumulative number of preemptions from the engine.",
        "num_preemptions_total",
    ),
)


class EngineCollector(Collector):
    """Reads the engine's counters when scraped; yields nothing while no engine is loaded."""

    def __init__(self, model_name: str, stats: StatsFn) -> None:
        self._model = model_name
        self._stats = stats

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._stats()
        if stats is None:
            return
        for name, doc, field in _GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=LABELS)
            gauge.add_metric([ENGINE, self._model], float(getattr(stats, field)))
            yield gauge
        for name, doc, field in _COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=LABELS)
            counter.add_metric([ENGINE, self._model], float(getattr(stats, field)))
            yield counter
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "enable_prefix_caching", "engine", "num_gpu_blocks"],
        )
        info.add_metric([str(stats.block_size), "True", ENGINE, str(stats.num_blocks)], 1.0)
        yield info


class WorkerMetrics:
    """One registry per worker app (tests build several apps in one process)."""

    def __init__(self, model_name: str, stats: StatsFn) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(model_name, stats))
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            LABELS,
            registry=self.registry,
            buckets=TTFT_BUCKETS,
        ).labels(ENGINE, model_name)
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            LABELS,
            registry=self.registry,
            buckets=ITL_BUCKETS,
        ).labels(ENGINE, model_name)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LABELS,
            registry=self.registry,
            buckets=E2E_BUCKETS,
        ).labels(ENGINE, model_name)
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*LABELS, "finished_reason"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def timed(
        self, outputs: AsyncIterator[GenerationOutput], started: float
    ) -> AsyncIterator[GenerationOutput]:
        """Pass ``outputs`` through, observing TTFT and inter-token latency per token, and
        end-to-end latency plus the finish reason when the answer completes. ``started`` is
        the ``time.monotonic()`` at which the request arrived. Closes ``outputs``."""
        last: float | None = None
        async with owned(outputs):
            async for out in outputs:
                now = time.monotonic()
                if out.token_ids:
                    self._observe_tokens(len(out.token_ids), now, last, started)
                    last = now
                if out.finish_reason is not None:
                    self.e2e.observe(now - started)
                    self.success.labels(ENGINE, self.model_name, out.finish_reason).inc()
                yield out

    def _observe_tokens(self, count: int, now: float, last: float | None, started: float) -> None:
        if last is None:
            self.ttft.observe(now - started)
            count -= 1  # the first token's latency is TTFT, not an inter-token gap
            last = now
        for _ in range(count):
            self.itl.observe((now - last) / max(count, 1))
