"""local_tier.engines + local_tier.vllm.metrics: each serving engine's ``/metrics`` page read
through its own mapping.

The pages in tests/fixtures/engine_metrics/ are written from each engine's exporter source and
documentation (names, metric types, HELP/TYPE lines, label sets): SGLang's collector with two
data-parallel ranks, TGI's router (metrics-rs exporter: unlabelled gauges, counters without
``_total``, summaries and histograms), Triton's tensorrtllm backend (``model``/``version``
labels, one label naming the statistic, an ensemble around the core model), llama.cpp's
server (current build, and a build before its KV gauges were removed), vLLM V0. vLLM V1 is the
captured page of tests/fixtures/vllm_metrics*.txt; the JAX worker's page is rendered here by
the worker's own exporter."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from core.config import VllmProviderConfig
from local_tier.engines import KINDS, MAPPINGS, mapping_for
from local_tier.engines.read import fold_series, index_samples
from local_tier.engines.spec import EngineMapping, Series, Signal
from local_tier.jax.api import EngineStats
from local_tier.vllm.metrics import (
    MetricsError,
    MetricsSnapshot,
    parse_metrics,
    split_page,
    ttft_totals,
)
from local_tier.worker.metrics import WorkerMetrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PAGES = FIXTURES / "engine_metrics"


def page(name: str) -> str:
    if name.startswith("vllm_metrics"):
        return (FIXTURES / f"{name}.txt").read_text()
    return (PAGES / f"{name}.txt").read_text()


def jax_page(running: int = 3, waiting: int = 2, kv: float = 0.5) -> str:
    """What a JAX worker serves, rendered by its own exporter."""
    stats = EngineStats(
        num_requests_running=running,
        num_requests_waiting=waiting,
        kv_cache_usage_perc=kv,
        prefix_cache_queries_total=4096,
        prefix_cache_hits_total=1024,
        prompt_tokens_total=5000,
        generation_tokens_total=900,
        block_size=16,
        num_blocks=2048,
    )
    metrics = WorkerMetrics("smollm2-135m-instruct", lambda: stats)
    metrics.ttft.observe(0.25)
    metrics.ttft.observe(0.75)
    return metrics.render().decode()


# Every page and what it reads as: (engine, page, snapshot, TTFT sum and count).
EXPECTED: list[tuple[str, str, MetricsSnapshot, tuple[float, float] | None]] = [
    (
        "sglang",
        "sglang_busy",
        MetricsSnapshot(
            read_at=0.0,
            num_requests_running=16 + 14,  # two data-parallel ranks add up
            num_requests_waiting=5 + 4,
            kv_cache_usage_perc=0.93,  # the fuller rank
            prefix_cache_queries=8.128902e06,
            prefix_cache_hits=3.104117e06 + 215003.0,  # device + host cache hits
            pool_tokens=2 * 207156,
        ),
        (1630.7462, 2063.0),
    ),
    (
        "sglang",
        "sglang_idle",
        MetricsSnapshot(0.0, 0, 0, 0.0, 8.128902e06, 3.104117e06 + 215003.0, pool_tokens=414312),
        (1630.7462, 2063.0),
    ),
    (
        "tgi",
        "tgi_busy",
        MetricsSnapshot(
            read_at=0.0,
            num_requests_running=24,
            num_requests_waiting=7,
            kv_cache_usage_perc=158336 / 161040,  # reserved batch tokens / token budget
            prefix_cache_queries=0.0,
            prefix_cache_hits=0.0,
            pool_tokens=161040,
        ),
        None,
    ),
    ("tgi", "tgi_idle", MetricsSnapshot(0.0, 0, 0, 0.0, 0.0, 0.0, pool_tokens=161040), None),
    # Before TGI's first request only the start-up gauge exists: idle, not unreadable.
    ("tgi", "tgi_fresh", MetricsSnapshot(0.0, 0, 0, 0.0, 0.0, 0.0, pool_tokens=161040), None),
    (
        "trtllm",
        "trtllm_busy",
        MetricsSnapshot(
            read_at=0.0,
            num_requests_running=32,  # request_type="scheduled"
            num_requests_waiting=8,
            kv_cache_usage_perc=5900 / 6239,  # used / max blocks
            prefix_cache_queries=0.0,
            prefix_cache_hits=0.0,
            block_size=64,
            num_gpu_blocks=6239,
        ),
        (440.3125, 1244.0),  # the core model's first responses only, ms -> s
    ),
    (
        "trtllm",
        "trtllm_idle",
        MetricsSnapshot(0.0, 0, 0, 0.0, 0.0, 0.0, block_size=64, num_gpu_blocks=6239),
        (440.3125, 1244.0),
    ),
    ("llamacpp", "llamacpp_busy", MetricsSnapshot(0.0, 4, 6, None, 0.0, 0.0), None),
    ("llamacpp", "llamacpp_idle", MetricsSnapshot(0.0, 0, 0, None, 0.0, 0.0), None),
    ("llamacpp", "llamacpp_legacy_busy", MetricsSnapshot(0.0, 2, 1, 0.8125, 0.0, 0.0), None),
    (
        "vllm",
        "vllm_v0_busy",
        MetricsSnapshot(0.0, 62, 11, 0.9612, 0.0, 0.0, block_size=16, num_gpu_blocks=27910),
        (1387.2, 3311.0),
    ),
    (
        "vllm",
        "vllm_metrics_busy",
        MetricsSnapshot(
            0.0, 9, 3, 0.07162534435261703, 2980.0, 256.0, block_size=128, num_gpu_blocks=364
        ),
        (513.9147846698761, 10.0),
    ),
]
IDS = [name for _, name, _, _ in EXPECTED]


@pytest.mark.parametrize(("kind", "name", "expected", "ttft"), EXPECTED, ids=IDS)
def test_each_engines_page_reads_as_expected(
    kind: str, name: str, expected: MetricsSnapshot, ttft: tuple[float, float] | None
) -> None:
    text, mapping = page(name), mapping_for(kind)
    assert parse_metrics(text, read_at=0.0, mapping=mapping) == expected
    assert ttft_totals(text, mapping) == ttft


@pytest.mark.parametrize(("kind", "name", "expected", "ttft"), EXPECTED, ids=IDS)
def test_the_cut_page_reads_like_the_whole_page(
    kind: str, name: str, expected: MetricsSnapshot, ttft: tuple[float, float] | None
) -> None:
    mapping = mapping_for(kind)
    cut, ttft_lines = split_page(page(name), mapping)
    assert parse_metrics(cut, read_at=0.0, mapping=mapping) == expected
    assert ttft_totals(ttft_lines, mapping) == ttft
    assert len(cut.splitlines()) <= 12 and not cut.startswith("#")


def without(text: str, *names: str) -> str:
    """``text`` less every sample line of the series ``names`` (their comments stay)."""
    pattern = re.compile(rf"^(?:{'|'.join(re.escape(n) for n in names)})[{{ ]")
    return "\n".join(line for line in text.splitlines() if not pattern.match(line)) + "\n"


MISSING = [
    ("sglang", "sglang_busy", ("sglang:num_running_reqs",)),
    ("sglang", "sglang_busy", ("sglang:num_queue_reqs",)),
    ("sglang", "sglang_busy", ("sglang:token_usage",)),
    ("tgi", "tgi_busy", ("tgi_queue_size", "tgi_batch_max_total_tokens")),
    ("tgi", "tgi_busy", ("tgi_batch_current_size", "tgi_batch_max_total_tokens")),
    ("trtllm", "trtllm_busy", ("nv_trt_llm_request_metrics",)),
    ("trtllm", "trtllm_busy", ("nv_trt_llm_kv_cache_block_metrics",)),
    ("llamacpp", "llamacpp_busy", ("llamacpp:requests_processing",)),
    ("llamacpp", "llamacpp_busy", ("llamacpp:requests_deferred",)),
    ("vllm", "vllm_v0_busy", ("vllm:gpu_cache_usage_perc",)),
    ("vllm", "vllm_v0_busy", ("vllm:num_requests_waiting",)),
]


@pytest.mark.parametrize(("kind", "name", "series"), MISSING, ids=[m[2][0] for m in MISSING])
def test_a_page_without_a_required_signal_is_an_error(
    kind: str, name: str, series: tuple[str, ...]
) -> None:
    mapping = mapping_for(kind)
    text = without(page(name), *series)
    with pytest.raises(MetricsError, match=f"missing from the {kind} page"):
        parse_metrics(text, read_at=0.0, mapping=mapping)
    with pytest.raises(MetricsError, match="missing"):
        parse_metrics(split_page(text, mapping)[0], read_at=0.0, mapping=mapping)


@pytest.mark.parametrize("kind", ["sglang", "tgi", "trtllm", "llamacpp", "jax"])
def test_another_engines_page_is_not_read_as_idle(kind: str) -> None:
    # A replica configured with the wrong engine fails loudly instead of reading 0.
    for name in ("vllm_metrics_busy", "sglang_busy", "tgi_busy", "trtllm_busy", "llamacpp_busy"):
        if name.startswith(kind) or (kind == "jax" and name.startswith("vllm")):
            continue
        with pytest.raises(MetricsError, match="missing"):
            parse_metrics(page(name), read_at=0.0, mapping=mapping_for(kind))


# ---------------------------------------------------------------- engine particulars
def test_sglang_rank_copies_count_once() -> None:
    # ``--tp 2 --enable-metrics-for-all-schedulers`` without DP attention: both tensor-parallel
    # schedulers report the one batch.
    lines = [
        line.replace('dp_rank="0",', "").replace('dp_rank="1",', "")
        for line in page("sglang_busy").splitlines()
    ]
    text = "\n".join(lines).replace("} 14.0", "} 16.0").replace("} 4.0", "} 5.0") + "\n"
    snap = parse_metrics(text, read_at=0.0, mapping=mapping_for("sglang"))
    assert (snap.num_requests_running, snap.num_requests_waiting) == (16, 5)
    assert snap.pool_tokens == 207156  # one pool, reported twice


def test_tgi_v2_backend_has_no_kv_signal() -> None:
    # The v2 backend sets no token budget: load is read, KV use is unknown, not 0.
    text = without(page("tgi_busy"), "tgi_batch_max_total_tokens")
    snap = parse_metrics(text, read_at=0.0, mapping=mapping_for("tgi"))
    assert (snap.num_requests_running, snap.num_requests_waiting) == (24, 7)
    assert snap.kv_cache_usage_perc is None and snap.kv_capacity_tokens is None


def test_tgi_without_any_of_its_series_is_an_error() -> None:
    with pytest.raises(MetricsError, match="tgi_batch_current_size missing"):
        parse_metrics("", read_at=0.0, mapping=mapping_for("tgi"))


def test_trtllm_kv_falls_back_to_the_fraction() -> None:
    text = without(page("trtllm_busy"), "nv_trt_llm_kv_cache_block_metrics")
    labels = 'kv_cache_block_type="fraction",model="m",version="1"'
    text += f"nv_trt_llm_kv_cache_block_metrics{{{labels}}} 0.5\n"
    snap = parse_metrics(text, read_at=0.0, mapping=mapping_for("trtllm"))
    assert snap.kv_cache_usage_perc == 0.5 and snap.block_size is None


def test_trtllm_models_and_versions_add_up() -> None:
    extra = [
        line.replace('version="1"', 'version="2"')
        for line in page("trtllm_busy").splitlines()
        if line.startswith(("nv_trt_llm_request_metrics{", "nv_trt_llm_kv_cache_block_metrics{"))
    ]
    text = page("trtllm_busy") + "\n".join(extra) + "\n"
    snap = parse_metrics(text, read_at=0.0, mapping=mapping_for("trtllm"))
    assert (snap.num_requests_running, snap.num_requests_waiting) == (64, 16)
    assert snap.kv_cache_usage_perc == pytest.approx(5900 / 6239)
    assert (snap.block_size, snap.num_gpu_blocks) == (64, 2 * 6239)


def test_trtllm_ttft_needs_the_histogram_of_the_core_model() -> None:
    text = page("trtllm_busy").replace(
        'model="tensorrt_llm",version="1",le', 'model="llm",version="1",le'
    )
    text = re.sub(
        r'(first_response_histogram_ms_(?:sum|count))\{model="tensorrt_llm"',
        r'\1{model="llm"',
        text,
    )
    assert ttft_totals(text, mapping_for("trtllm")) is None


def test_llamacpp_counters_without_total_read_alike_typed_or_cut() -> None:
    # The parser names a typed counter ``llamacpp:n_tokens_max`` ``..._total``; a cut page
    # keeps the page's spelling. Both are found under the page's name.
    series = Series("llamacpp:n_tokens_max")
    from prometheus_client.parser import text_string_to_metric_families as families

    whole = index_samples(families(page("llamacpp_busy")))
    cut = index_samples(families("llamacpp:n_tokens_max 42094\n"))
    assert fold_series(whole, series) == fold_series(cut, series) == 42094.0


def test_vllm_v1_before_its_renames() -> None:
    text = (
        'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1\n'
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
        'vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 10\n'
        'vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 4\n'
    )
    snap = parse_metrics(text, read_at=0.0, mapping=mapping_for("vllm"))
    assert (snap.kv_cache_usage_perc, snap.prefix_hit_rate) == (0.5, 0.4)


def test_the_jax_workers_own_page() -> None:
    mapping = mapping_for("jax")
    text = jax_page()
    snap = parse_metrics(text, read_at=2.0, mapping=mapping)
    assert snap == MetricsSnapshot(2.0, 3, 2, 0.5, 4096.0, 1024.0, 16, 2048)
    cut, ttft = split_page(text, mapping)
    assert parse_metrics(cut, read_at=2.0, mapping=mapping) == snap
    assert ttft_totals(ttft, mapping) == (1.0, 2.0)
    # The worker exports only current names: a V0 page is not a JAX page.
    with pytest.raises(MetricsError, match="vllm:kv_cache_usage_perc missing"):
        parse_metrics(page("vllm_v0_busy"), read_at=0.0, mapping=mapping)


# ---------------------------------------------------------------- the registry
def test_every_configurable_engine_has_a_mapping() -> None:
    hints = typing.get_type_hints(VllmProviderConfig)
    assert set(typing.get_args(hints["engine"])) == set(KINDS) == set(MAPPINGS)
    assert all(mapping_for(kind).kind == kind for kind in KINDS)
    assert VllmProviderConfig().engine == "vllm"
    with pytest.raises(ValueError, match="no metrics mapping for engine 'ollama'"):
        mapping_for("ollama")


def test_engines_without_a_signal_say_so() -> None:
    for kind in ("tgi", "llamacpp"):
        mapping = mapping_for(kind)
        assert mapping.kv_usage is not None and not mapping.kv_usage.required
        assert mapping.prefix_queries is None and mapping.ttft is None
        assert any("KV" in note for note in mapping.notes)
    for kind in ("vllm", "sglang", "trtllm", "jax"):
        kv = mapping_for(kind).kv_usage
        assert kv is not None and kv.required


def test_a_mapping_must_require_running_and_waiting() -> None:
    loose = Signal((Series("x"),))
    with pytest.raises(ValueError, match="must be required"):
        EngineMapping("x", running=loose, waiting=loose, kv_usage=None)
    with pytest.raises(ValueError, match="at least one source"):
        Signal(())
