"""The worker's ``/metrics``: vLLM's metric names, so scrapers and the gateway's capacity
signals read a JAX worker and a vLLM worker alike.

Engine-wide gauges and counters are read from ``engine.stats()`` at scrape time (one source
of truth, no double counting); latency histograms are observed per request by ``timed()``:
TTFT and inter-token latency as tokens arrive; on finish, end-to-end latency, the success
counter and vLLM's per-request phase histograms (queue, prefill, decode, inference, mean time
per output token, prompt/generation token counts), defined as in vLLM v1
(``vllm/v1/metrics/stats.py``, ``IterationStats.update_from_finished_request``).
Every series carries ``engine="0"`` and ``model_name`` like vLLM's; ``vllm:cache_config_info``
carries the KV cache geometry as labels with the value 1.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from local_tier.iterators import owned
from local_tier.jax.api import EngineStats, GenerationOutput

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
# vLLM shares the e2e buckets with the queue/prefill/decode/inference phase histograms, and
# the inter-token buckets with the per-request mean time per output token.
REQUEST_LATENCY_BUCKETS = E2E_BUCKETS
TPOT_BUCKETS = ITL_BUCKETS


def token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's ``build_1_2_5_buckets(max_model_len)``: 1, 2, 5, 10, 20, 50, ... up to and
    including ``max_model_len``; the buckets of its per-request token-count histograms."""
    out: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(out)
            out.append(float(mantissa * scale))
        scale *= 10


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


@dataclass
class _Timeline:
    """What ``timed()`` saw of one request, on the worker's monotonic clock."""

    started: float  # arrival
    scheduled: float | None = None  # the engine's first scheduling (``scheduled_at``)
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0  # generated tokens seen

    def saw_tokens(self, count: int, now: float) -> None:
        if self.first_token is None:
            self.first_token = now
        self.last_token = now
        self.tokens += count


class WorkerMetrics:
    """One registry per worker app (tests build several apps in one process).

    ``now`` is the clock ``timed()`` reads; it must be the one ``started`` and the engine's
    ``scheduled_at`` come from (``time.monotonic``). The token-count histograms need vLLM's
    ``max_model_len``-capped buckets, so they exist only when ``max_model_len`` is given."""

    def __init__(
        self,
        model_name: str,
        stats: StatsFn,
        *,
        max_model_len: int | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(model_name, stats))
        self._now = now
        self.ttft = self._histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = self._histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.e2e = self._histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            E2E_BUCKETS,
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*LABELS, "finished_reason"],
            registry=self.registry,
        )
        self._add_phase_histograms()
        self.token_counts = None if max_model_len is None else self._token_histograms(max_model_len)

    def _histogram(self, name: str, doc: str, buckets: Sequence[float]) -> Histogram:
        return Histogram(name, doc, LABELS, registry=self.registry, buckets=buckets).labels(
            ENGINE, self.model_name
        )

    def _add_phase_histograms(self) -> None:
        # Names, help strings and buckets are vLLM v1's (vllm/v1/metrics/loggers.py).
        self.queue_time = self._histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_time = self._histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode_time = self._histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.inference_time = self._histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.tpot = self._histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            TPOT_BUCKETS,
        )

    def _token_histograms(self, max_model_len: int) -> tuple[Histogram, Histogram, Histogram]:
        """vLLM's per-request token counts: prompt, generation, max generation (this order)."""
        buckets = token_buckets(max_model_len)
        return (
            self._histogram(
                "vllm:request_prompt_tokens", "Number of prefill tokens processed.", buckets
            ),
            self._histogram(
                "vllm:request_generation_tokens", "Number of generation tokens processed.", buckets
            ),
            self._histogram(
                "vllm:request_max_num_generation_tokens",
                "Histogram of maximum number of requested generation tokens.",
                buckets,
            ),
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def timed(
        self, outputs: AsyncIterator[GenerationOutput], started: float
    ) -> AsyncIterator[GenerationOutput]:
        """Pass ``outputs`` through, observing TTFT and inter-token latency per token, and
        end-to-end latency, the finish reason and the phase histograms when the answer
        completes. ``started`` is the ``time.monotonic()`` at which the request arrived.
        A stream closed before its finishing output observes no end-of-request metric (like
        vLLM, which records those only for finished requests). Closes ``outputs``."""
        seen = _Timeline(started)
        async with owned(outputs):
            async for out in outputs:
                now = self._now()
                if seen.scheduled is None:
                    seen.scheduled = out.scheduled_at
                if out.token_ids:
                    self._observe_tokens(len(out.token_ids), now, seen.last_token, started)
                    seen.saw_tokens(len(out.token_ids), now)
                if out.finish_reason is not None:
                    self.e2e.observe(now - started)
                    self.success.labels(ENGINE, self.model_name, out.finish_reason).inc()
                    self._observe_phases(seen)
                    self._observe_counts(out)
                yield out

    def _observe_tokens(self, count: int, now: float, last: float | None, started: float) -> None:
        if last is None:
            self.ttft.observe(now - started)
            count -= 1  # the first token's latency is TTFT, not an inter-token gap
            last = now
        for _ in range(count):
            self.itl.observe((now - last) / max(count, 1))

    def _observe_phases(self, seen: _Timeline) -> None:
        """vLLM's phases: queue = arrival..first scheduled, prefill = first scheduled..first
        token, decode = first..last token, inference = first scheduled..last token, mean time
        per output token = decode / (tokens - 1), or 0 with at most one token (vLLM observes
        the 0). A phase whose end points are unknown (never scheduled, no token, or an engine
        that does not report ``scheduled_at``) is not observed rather than guessed."""
        if seen.scheduled is not None:
            self.queue_time.observe(seen.scheduled - seen.started)
        if seen.first_token is None or seen.last_token is None:
            return
        decode = seen.last_token - seen.first_token
        self.decode_time.observe(decode)
        self.tpot.observe(decode / (seen.tokens - 1) if seen.tokens > 1 else 0.0)
        if seen.scheduled is not None:
            self.prefill_time.observe(seen.first_token - seen.scheduled)
            self.inference_time.observe(seen.last_token - seen.scheduled)

    def _observe_counts(self, final: GenerationOutput) -> None:
        """Token counts from the final output's usage. The engine runs one sequence per
        request (no ``n`` fan-out), so vLLM's max over parallel samples is the generation
        count itself."""
        if self.token_counts is None:
            return
        prompt, generation, max_generation = self.token_counts
        prompt.observe(final.prompt_tokens)
        generation.observe(final.completion_tokens)
        max_generation.observe(final.completion_tokens)
