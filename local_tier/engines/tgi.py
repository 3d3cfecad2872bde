"""Hugging Face TGI's names (``router/src/server.rs``, ``backends/v3/src/{backend,queue}.rs``;
``docs/source/reference/metrics.md``). TGI renders them with the Rust ``metrics`` crate's
Prometheus exporter: no labels on the gauges read here, counters without ``_total``.

- Load: ``tgi_batch_current_size`` (requests in the running batch) and ``tgi_queue_size``
  (requests queued).
- KV use is not exported. It is derived, on the v3 backend (TGI 2.3.1 and later), as
  ``tgi_batch_current_max_tokens / tgi_batch_max_total_tokens``: the tokens the running batch
  has reserved (prompt plus ``max_new_tokens`` of each request) over the token budget the
  router admits batches against (its own ``max_batch_total_tokens`` check), so 1 means TGI
  queues what comes next. Without ``tgi_batch_max_total_tokens`` (v2 backend) KV use is unknown.
- The exporter renders a gauge only once it has been set, so before the first request a v3
  page carries ``tgi_batch_max_total_tokens`` (set at start-up) and neither load gauge: they are
  read as 0 when that series is present.
"""

from __future__ import annotations

from local_tier.engines.spec import EngineMapping, Ratio, Series, Signal

BUDGET = "tgi_batch_max_total_tokens"

TGI = EngineMapping(
    kind="tgi",
    running=Signal((Series("tgi_batch_current_size"),), required=True, zero_if_present=BUDGET),
    waiting=Signal((Series("tgi_queue_size"),), required=True, zero_if_present=BUDGET),
    kv_usage=Signal(
        (Ratio(Series("tgi_batch_current_max_tokens"), Series(BUDGET)),),
        zero_if_present=BUDGET,
    ),
    pool_tokens=Signal((Series(BUDGET),)),
    notes=(
        "no KV-use gauge: derived from the running batch's reserved tokens over the token "
        "budget (v3 backend); unknown on the v2 backend, where saturation rests on "
        "waiting and max_in_flight",
        "no prefix-cache counters: hit rate unknown",
        "no TTFT histogram (tgi_request_queue_duration is queueing only): the gateway's own "
        "TTFT measurements are the only TTFT data",
    ),
)
