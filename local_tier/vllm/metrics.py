"""Read a local worker's ``/metrics`` into a typed snapshot.

The capacity and spill-over logic decides from these numbers whether a replica can take one
more request, so the contract is strict about what "unknown" means:

- ``parse_metrics(text, read_at=...)`` is pure. It raises ``MetricsError`` when the page lacks
  the three load signals (running, waiting, KV use): a snapshot without them would look idle.
- Counters and gauges are summed over label sets (one vLLM server with data-parallel engines
  reports one series per ``engine``; the served model name is a label too).
- The prefix-cache counters and ``cache_config_info`` are optional (``0.0`` / ``None`` when
  absent): older builds and other engines may not export them.
- ``read_at`` is a monotonic time from the caller's clock; ``age()`` tells how stale the snapshot
  is, and stale snapshots count as saturated upstream of here.

Names follow vLLM's V1 engine (``vllm:kv_cache_usage_perc``, ``vllm:prefix_cache_*``); the V0
names (``vllm:gpu_cache_usage_perc``, ``vllm:gpu_prefix_cache_*``) are read as fallbacks so a
GPU pool on an older vLLM still reports. The JAX engine exports the same names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from core.clock import Clock, SystemClock

RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
CACHE_CONFIG = "vllm:cache_config_info"


class MetricsError(Exception):
    """The metrics page could not be read, or it is not a vLLM-style page."""


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """One read of a worker's load signals. ``read_at`` is monotonic seconds."""

    read_at: float
    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage_perc: float  # 0-1, fraction of KV blocks in use
    prefix_cache_queries: float  # tokens looked up in the prefix cache since start
    prefix_cache_hits: float  # of which found
    block_size: int | None = None  # tokens per KV block
    num_gpu_blocks: int | None = None  # KV blocks in the pool (CPU blocks on the CPU build)

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
        if self.block_size is None or self.num_gpu_blocks is None:
            return None
        return self.block_size * self.num_gpu_blocks


def _index(text: str) -> dict[str, list[Sample]]:
    """Samples by sample name (``..._total`` for counters), in page order."""
    by_name: dict[str, list[Sample]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                by_name.setdefault(sample.name, []).append(sample)
    except ValueError as exc:  # the parser's only complaint for malformed text
        raise MetricsError(f"malformed metrics text: {exc}") from exc
    return by_name


def _sum(by_name: dict[str, list[Sample]], names: Iterable[str]) -> float | None:
    """Sum over label sets of the first name present; ``None`` if none is."""
    for name in names:
        if name in by_name:
            return float(sum(s.value for s in by_name[name]))
    return None


def _required(by_name: dict[str, list[Sample]], names: tuple[str, ...]) -> float:
    value = _sum(by_name, names)
    if value is None:
        raise MetricsError(f"metric {names[0]} missing from the page")
    return value


def _label_int(by_name: dict[str, list[Sample]], label: str) -> int | None:
    """An integer label of ``cache_config_info`` (its value is always 1; the data is in labels)."""
    for sample in by_name.get(CACHE_CONFIG, []):
        raw = sample.labels.get(label)
        if raw is not None and raw.isdigit():
            return int(raw)
    return None


def parse_metrics(text: str, *, read_at: float) -> MetricsSnapshot:
    """Parse Prometheus exposition text into a snapshot (pure)."""
    by_name = _index(text)
    return MetricsSnapshot(
        read_at=read_at,
        num_requests_running=round(_required(by_name, RUNNING)),
        num_requests_waiting=round(_required(by_name, WAITING)),
        kv_cache_usage_perc=_required(by_name, KV_USAGE),
        prefix_cache_queries=_sum(by_name, PREFIX_QUERIES) or 0.0,
        prefix_cache_hits=_sum(by_name, PREFIX_HITS) or 0.0,
        block_size=_label_int(by_name, "block_size"),
        num_gpu_blocks=_label_int(by_name, "num_gpu_blocks"),
    )


def _page(response: httpx.Response) -> str:
    if response.status_code != 200:
        raise MetricsError(f"GET {response.request.url} answered {response.status_code}")
    return response.text


def fetch_metrics(
    base_url: str, client: httpx.Client, clock: Clock | None = None, timeout: float = 2.0
) -> MetricsSnapshot:
    """GET ``{base_url}/metrics`` and parse it; transport failures become ``MetricsError``.

    ``base_url`` is the server root (``http://127.0.0.1:8000``), without ``/v1``.
    """
    clock = clock or SystemClock()
    try:
        response = client.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout)
    except httpx.HTTPError as exc:
        raise MetricsError(f"GET {base_url}/metrics failed: {exc!r}") from exc
    return parse_metrics(_page(response), read_at=clock.now())


async def afetch_metrics(
    base_url: str, client: httpx.AsyncClient, clock: Clock | None = None, timeout: float = 2.0
) -> MetricsSnapshot:
    """Async twin of ``fetch_metrics``, for pollers that run in the gateway's event loop."""
    clock = clock or SystemClock()
    try:
        response = await client.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout)
    except httpx.HTTPError as exc:
        raise MetricsError(f"GET {base_url}/metrics failed: {exc!r}") from exc
    return parse_metrics(_page(response), read_at=clock.now())


# ---- cutting a page down before parsing (a poller reads it 10 times a second)

TTFT_SUM = "vllm:time_to_first_token_seconds_sum"
TTFT_COUNT = "vllm:time_to_first_token_seconds_count"
_SNAPSHOT_NAMES = frozenset(
    (*RUNNING, *WAITING, *KV_USAGE, *PREFIX_QUERIES, *PREFIX_HITS, CACHE_CONFIG)
)


def split_page(text: str) -> tuple[str, str]:
    """(the lines ``parse_metrics`` needs, the TTFT sum/count lines), comments dropped."""
    keep: list[str] = []
    ttft: list[str] = []
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        brace, space = line.find("{"), line.find(" ")
        cut = min(i for i in (brace, space, len(line)) if i >= 0)
        name = line[:cut]
        if name in _SNAPSHOT_NAMES:
            keep.append(line)
        elif name in (TTFT_SUM, TTFT_COUNT):
            ttft.append(line)
    return "\n".join(keep) + "\n", "\n".join(ttft) + "\n"


def ttft_totals(lines: str) -> tuple[float, float] | None:
    """(sum, count) of the TTFT histogram over all label sets; ``None`` when absent."""
    totals = {TTFT_SUM: 0.0, TTFT_COUNT: 0.0}
    seen = False
    with contextlib.suppress(ValueError):
        for family in text_string_to_metric_families(lines):
            for sample in family.samples:
                if sample.name in totals:
                    totals[sample.name] += sample.value
                    seen = True
    return (totals[TTFT_SUM], totals[TTFT_COUNT]) if seen else None
