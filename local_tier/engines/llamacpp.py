"""llama.cpp's ``llama-server`` (``tools/server``; served with ``--metrics``). Every series is an
unlabelled ``llamacpp:`` gauge or counter; in router mode ``/metrics`` needs ``?model=``.

- Load: ``llamacpp:requests_processing`` (slots busy) and ``llamacpp:requests_deferred``
  (requests waiting for a slot).
- KV use: ``llamacpp:kv_cache_usage_ratio`` (used cells / context size) existed until llama.cpp
  PR #13660 (May 2025) removed it with ``llamacpp:kv_cache_tokens``; newer builds export no KV
  signal. Each slot owns a fixed share of the context, so a full server shows as all slots
  busy and requests deferred: saturation rests on ``requests_deferred`` (``max_waiting``) and
  ``max_in_flight``.
- No prefix-cache counters and no TTFT histogram (``n_busy_slots_per_decode`` and the
  throughput gauges are lifetime averages, not load).
"""

from __future__ import annotations

from local_tier.engines.spec import EngineMapping, Series, Signal

LLAMACPP = EngineMapping(
    kind="llamacpp",
    running=Signal((Series("llamacpp:requests_processing"),), required=True),
    waiting=Signal((Series("llamacpp:requests_deferred"),), required=True),
    kv_usage=Signal((Series("llamacpp:kv_cache_usage_ratio"),)),
    notes=(
        "KV use only on builds before PR #13660 (llamacpp:kv_cache_usage_ratio); unknown on "
        "newer ones, where saturation rests on requests_deferred and max_in_flight",
        "no prefix-cache counters: hit rate unknown",
        "no TTFT histogram: the gateway's own TTFT measurements are the only TTFT data",
        "no KV pool size: prompt tokens in flight do not move the KV estimate",
    ),
)
