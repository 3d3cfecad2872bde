"""Read a local worker's ``/metrics`` into a typed snapshot, through its engine's mapping.

The capacity and spill-over logic decides from these numbers whether a replica can take one
more request, so the contract is strict about what "unknown" means:

- ``parse_metrics(text, read_at=..., mapping=...)`` is pure. It raises ``MetricsError`` when the
  page lacks a signal the engine's mapping requires (running and waiting always, KV use where
  the engine always exports it): a snapshot without them would look idle.
- Where each number is, and how label sets fold into it (summed over data-parallel engines and
  served models, one label's value picked, a ratio of two series), is the mapping's: see
  ``local_tier.engines``. The default mapping is vLLM's (V1 names, older names as fallbacks),
  which the JAX worker's page also satisfies.
- KV use is ``None`` when the engine exports no KV signal (llama.cpp's newer builds, TGI's v2
  backend): unknown, never a silent 0. The prefix-cache counters are ``0.0`` when absent (the hit
  rate is then ``None``); the pool geometry is ``None`` when absent.
- ``read_at`` is a monotonic time from the caller's clock; ``age()`` tells how stale the snapshot
  is, and stale snapshots count as saturated upstream of here.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from core.clock import Clock, SystemClock
from local_tier.engines.read import (
    Index,
    histogram_totals,
    index_samples,
    signal_value,
)
from local_tier.engines.spec import EngineMapping, Signal
from local_tier.engines.vllm import VLLM


class MetricsError(Exception):
    """The metrics page could not be read, or it is not the configured engine's page."""


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """One read of a worker's load signals. ``read_at`` is monotonic seconds."""

    read_at: float
    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage_perc: float | None  # 0-1, KV pool in use; None: the engine exports none
    prefix_cache_queries: float  # tokens looked up in the prefix cache since start
    prefix_cache_hits: float  # of which found
    block_size: int | None = None  # tokens per KV block
    num_gpu_blocks: int | None = None  # KV blocks in the pool (CPU blocks on the CPU build)
    pool_tokens: int | None = None  # the KV pool in tokens, where the engine states it so

    def age(self, now: float) -> float:
        """Seconds since the read, on the same monotonic clock as ``read_at``."""
        return now - self.read_at

    @property
    def idle(self) -> bool:
        """No request is running or waiting."""
        return self.num_requests_running == 0 and self.num_requests_waiting == 0

    @property
    def prefix_hit_rate(self) -> float | None:
        """Lifetime hit fraction of prefix-cache lookups; ``None`` before any lookup."""
        if self.prefix_cache_queries <= 0:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries

    @property
    def kv_capacity_tokens(self) -> int | None:
        """Tokens the KV pool holds in total, when the page says how it is configured."""
        if self.pool_tokens is not None:
            return self.pool_tokens
        if self.block_size is None or self.num_gpu_blocks is None:
            return None
        return self.block_size * self.num_gpu_blocks


def _index(text: str) -> dict[str, list[Sample]]:
    """Samples by sample name; ``MetricsError`` for text the parser refuses."""
    try:
        return index_samples(text_string_to_metric_families(text))
    except ValueError as exc:  # the parser's only complaint for malformed text
        raise MetricsError(f"malformed metrics text: {exc}") from exc


def _required(index: Index, signal: Signal, mapping: EngineMapping) -> float:
    value = signal_value(index, signal)
    if value is None:
        raise MetricsError(f"metric {signal.primary_name()} missing from the {mapping.kind} page")
    return value


def _optional(index: Index, signal: Signal | None) -> float | None:
    return None if signal is None else signal_value(index, signal)


def _kv(index: Index, mapping: EngineMapping) -> float | None:
    signal = mapping.kv_usage
    if signal is None:
        return None
    return _required(index, signal, mapping) if signal.required else signal_value(index, signal)


def _whole(value: float | None) -> int | None:
    return None if value is None else round(value)


def snapshot_from(index: Index, read_at: float, mapping: EngineMapping) -> MetricsSnapshot:
    """A snapshot of an indexed page (see ``local_tier.engines.read.index_samples``)."""
    return MetricsSnapshot(
        read_at=read_at,
        num_requests_running=round(_required(index, mapping.running, mapping)),
        num_requests_waiting=round(_required(index, mapping.waiting, mapping)),
        kv_cache_usage_perc=_kv(index, mapping),
        prefix_cache_queries=_optional(index, mapping.prefix_queries) or 0.0,
        prefix_cache_hits=_optional(index, mapping.prefix_hits) or 0.0,
        block_size=_whole(_optional(index, mapping.block_size)),
        num_gpu_blocks=_whole(_optional(index, mapping.num_blocks)),
        pool_tokens=_whole(_optional(index, mapping.pool_tokens)),
    )


def parse_metrics(text: str, *, read_at: float, mapping: EngineMapping = VLLM) -> MetricsSnapshot:
    """Parse Prometheus exposition text into a snapshot through ``mapping`` (pure)."""
    return snapshot_from(_index(text), read_at, mapping)


def _page(response: httpx.Response) -> str:
    if response.status_code != 200:
        raise MetricsError(f"GET {response.request.url} answered {response.status_code}")
    return response.text


def fetch_metrics(
    base_url: str,
    client: httpx.Client,
    clock: Clock | None = None,
    timeout: float = 2.0,
    mapping: EngineMapping = VLLM,
) -> MetricsSnapshot:
    """GET ``{base_url}/metrics`` and parse it; transport failures become ``MetricsError``.

    ``base_url`` is the server root (``http://127.0.0.1:8000``), without ``/v1``.
    """
    clock = clock or SystemClock()
    try:
        response = client.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout)
    except httpx.HTTPError as exc:
        raise MetricsError(f"GET {base_url}/metrics failed: {exc!r}") from exc
    return parse_metrics(_page(response), read_at=clock.now(), mapping=mapping)


async def afetch_metrics(
    base_url: str,
    client: httpx.AsyncClient,
    clock: Clock | None = None,
    timeout: float = 2.0,
    mapping: EngineMapping = VLLM,
) -> MetricsSnapshot:
    """Async twin of ``fetch_metrics``, for pollers that run in the gateway's event loop."""
    clock = clock or SystemClock()
    try:
        response = await client.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout)
    except httpx.HTTPError as exc:
        raise MetricsError(f"GET {base_url}/metrics failed: {exc!r}") from exc
    return parse_metrics(_page(response), read_at=clock.now(), mapping=mapping)


# ---- cutting a page down before parsing (a poller reads it 10 times a second)


def _sample_name(line: str) -> str:
    brace, space = line.find("{"), line.find(" ")
    cut = min(i for i in (brace, space, len(line)) if i >= 0)
    return line[:cut]


def split_page(text: str, mapping: EngineMapping = VLLM) -> tuple[str, str]:
    """(the lines ``parse_metrics`` needs, the TTFT sum/count lines), comments dropped.

    Only the series ``mapping`` reads are kept, so parsing the cut page gives the snapshot
    the whole page gives, at a fraction of the cost."""
    snapshot_names, ttft_names = mapping.snapshot_names(), mapping.ttft_names()
    prefixes = tuple(snapshot_names | ttft_names)
    keep: list[str] = []
    ttft: list[str] = []
    for line in text.splitlines():
        if not line.startswith(prefixes):
            continue
        name = _sample_name(line)
        if name in snapshot_names:
            keep.append(line)
        elif name in ttft_names:
            ttft.append(line)
    return "\n".join(keep) + "\n", "\n".join(ttft) + "\n"


def ttft_totals(lines: str, mapping: EngineMapping = VLLM) -> tuple[float, float] | None:
    """(sum in seconds, count) of the engine's TTFT histogram over the label sets it reads;
    ``None`` when the page has none (or the engine exports none)."""
    if mapping.ttft is None:
        return None
    index: Index = {}
    with contextlib.suppress(ValueError):
        index = index_samples(text_string_to_metric_families(lines))
    return histogram_totals(index, mapping.ttft)
