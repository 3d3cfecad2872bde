"""SGLang's names (``python/sglang/srt/metrics/collector.py``; served with ``--enable-metrics``).

- Load: the scheduler's gauges ``sglang:num_running_reqs`` and ``sglang:num_queue_reqs``; KV use
  ``sglang:token_usage`` (used / total tokens of the KV pool, 0-1) and the pool's size
  ``sglang:max_total_num_tokens``.
- Prefix cache: the tokenizer manager's counters ``sglang:prompt_tokens_total`` (prompt tokens of
  finished requests) and ``sglang:cached_tokens_total`` (of which served from the radix cache;
  newer releases split it by a ``cache_source`` label, summed here).
- TTFT: the histogram ``sglang:time_to_first_token_seconds``.

Labels: ``model_name`` always; newer releases add ``engine_type``, ``tp_rank``, ``pp_rank``,
``moe_ep_rank`` and, with data-parallel attention, ``dp_rank``. Only the scheduler of attention
tensor-parallel rank 0 reports by default; with ``--enable-metrics-for-all-schedulers`` every
rank reports the same batch, so the rank labels index copies of one number (counted once),
while data-parallel ranks, each with its own batch, add up. KV use across data-parallel ranks
is the fullest rank's.
"""

from __future__ import annotations

from local_tier.engines.spec import EngineMapping, Histogram, Series, Signal

RANKS = ("tp_rank", "pp_rank", "moe_ep_rank")

SGLANG = EngineMapping(
    kind="sglang",
    running=Signal((Series("sglang:num_running_reqs", copies=RANKS),), required=True),
    waiting=Signal((Series("sglang:num_queue_reqs", copies=RANKS),), required=True),
    kv_usage=Signal((Series("sglang:token_usage", copies=RANKS, fold="max"),), required=True),
    prefix_queries=Signal((Series("sglang:prompt_tokens_total", copies=RANKS),)),
    prefix_hits=Signal((Series("sglang:cached_tokens_total", copies=RANKS),)),
    pool_tokens=Signal((Series("sglang:max_total_num_tokens", copies=RANKS),)),
    ttft=Histogram("sglang:time_to_first_token_seconds"),
    notes=(
        "the scheduler sets its gauges at its first logged batch (or its idle log, 30 s after "
        "start in releases that have one): until then the page lacks them and the replica "
        "reads as unreachable (saturated), never as idle",
        "the radix cache's page size is not exported: block_size and num_blocks stay unknown; "
        "the pool size in tokens (sglang:max_total_num_tokens) is read instead",
    ),
)
