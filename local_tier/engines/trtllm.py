"""TensorRT-LLM served by Triton's ``tensorrtllm`` backend (``custom_metrics_reporter.cc`` in
``triton_backend/inflight_batcher_llm``; the backend repository's README, "Triton Metrics").

Each family is one gauge with a ``model`` and ``version`` label (Triton's) and one label
naming the statistic:

- ``nv_trt_llm_request_metrics{request_type=...}``: ``scheduled`` (requests in this iteration's
  batch, read as running), ``waiting`` (active minus scheduled), ``active``, ``context``,
  ``max`` (the batch's request limit).
- ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=...}``: ``used``, ``free``, ``max``,
  ``tokens_per`` (tokens per block), and in later releases ``reused`` and ``fraction``. KV use is
  ``used / max`` (in every release), else ``fraction``.
- TTFT: Triton's ``nv_inference_first_response_histogram_ms`` (milliseconds; only with
  ``--metrics-config histogram_latencies=true``) for the core model named ``tensorrt_llm``,
  which in a streaming deployment answers its first token first. Other models of an ensemble
  (pre- and post-processing) are not TTFT and are not read.
"""

from __future__ import annotations

from local_tier.engines.spec import EngineMapping, Fold, Histogram, Ratio, Series, Signal

REQUESTS = "nv_trt_llm_request_metrics"
BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
CORE_MODEL = "tensorrt_llm"


def requests(kind: str) -> Series:
    """The request gauge of ``request_type`` ``kind``, summed over models and versions."""
    return Series(REQUESTS, where=(("request_type", kind),))


def blocks(kind: str, fold: Fold = "sum") -> Series:
    """The KV block gauge of ``kv_cache_block_type`` ``kind``, folded by ``fold``."""
    return Series(BLOCKS, where=(("kv_cache_block_type", kind),), fold=fold)


TRTLLM = EngineMapping(
    kind="trtllm",
    running=Signal((requests("scheduled"),), required=True),
    waiting=Signal((requests("waiting"),), required=True),
    kv_usage=Signal(
        (Ratio(blocks("used"), blocks("max")), blocks("fraction", "max")), required=True
    ),
    block_size=Signal((blocks("tokens_per", "max"),)),
    num_blocks=Signal((blocks("max"),)),
    ttft=Histogram(
        "nv_inference_first_response_histogram_ms", where=(("model", CORE_MODEL),), scale=1e-3
    ),
    notes=(
        "no prefix-cache query counter (only reused blocks): hit rate unknown",
        "TTFT only with Triton's histogram latencies on and the core model named tensorrt_llm",
    ),
)
