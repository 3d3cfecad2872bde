"""vLLM's names, and the JAX worker's (which exports vLLM V1's names).

vLLM V1 (``vllm/v1/metrics/loggers.py``) labels every series with ``engine`` (one per
data-parallel engine) and ``model_name``; the series are summed over them. Its names moved
twice, so the ``vllm`` mapping reads the current name first and the older after:

- KV use: ``vllm:kv_cache_usage_perc`` (since vLLM PR #18354), else
  ``vllm:gpu_cache_usage_perc`` (V0, and V1 before the rename).
- Prefix cache: ``vllm:prefix_cache_{queries,hits}_total`` (V1 since 0.10), else
  ``vllm:gpu_prefix_cache_{queries,hits}_total`` (V1 before 0.10, deprecated with the rename).
- Geometry: ``vllm:cache_config_info``'s ``block_size`` and ``num_gpu_blocks`` labels (V0 and V1).

The JAX worker (``local_tier/worker/metrics.py``) exports exactly the current V1 names, so the
``jax`` mapping has no fallbacks: a JAX page without them is not a JAX page.
"""

from __future__ import annotations

from local_tier.engines.spec import EngineMapping, Histogram, InfoLabel, Series, Signal

RUNNING = Series("vllm:num_requests_running")
WAITING = Series("vllm:num_requests_waiting")
KV_USAGE = Series("vllm:kv_cache_usage_perc")
KV_USAGE_LEGACY = Series("vllm:gpu_cache_usage_perc")
PREFIX_QUERIES = Series("vllm:prefix_cache_queries_total")
PREFIX_QUERIES_LEGACY = Series("vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = Series("vllm:prefix_cache_hits_total")
PREFIX_HITS_LEGACY = Series("vllm:gpu_prefix_cache_hits_total")
CACHE_CONFIG = "vllm:cache_config_info"
TTFT = Histogram("vllm:time_to_first_token_seconds")

VLLM = EngineMapping(
    kind="vllm",
    running=Signal((RUNNING,), required=True),
    waiting=Signal((WAITING,), required=True),
    kv_usage=Signal((KV_USAGE, KV_USAGE_LEGACY), required=True),
    prefix_queries=Signal((PREFIX_QUERIES, PREFIX_QUERIES_LEGACY)),
    prefix_hits=Signal((PREFIX_HITS, PREFIX_HITS_LEGACY)),
    block_size=Signal((InfoLabel(CACHE_CONFIG, "block_size"),)),
    num_blocks=Signal((InfoLabel(CACHE_CONFIG, "num_gpu_blocks"),)),
    ttft=TTFT,
    notes=(
        "V0 exports a prefix-cache hit-rate gauge (vllm:gpu_prefix_cache_hit_rate), not "
        "counts: it is not read, the prefix counters stay 0 and the hit rate unknown",
        "KV use is summed over data-parallel engines (a cautious over-estimate)",
    ),
)

JAX = EngineMapping(
    kind="jax",
    running=Signal((RUNNING,), required=True),
    waiting=Signal((WAITING,), required=True),
    kv_usage=Signal((KV_USAGE,), required=True),
    prefix_queries=Signal((PREFIX_QUERIES,)),
    prefix_hits=Signal((PREFIX_HITS,)),
    block_size=Signal((InfoLabel(CACHE_CONFIG, "block_size"),)),
    num_blocks=Signal((InfoLabel(CACHE_CONFIG, "num_gpu_blocks"),)),
    ttft=TTFT,
)
