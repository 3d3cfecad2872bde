"""The worker's vLLM phase histograms, driven by ``WorkerMetrics.timed()`` over scripted
outputs and an injected clock: exact sums and counts per phase, vLLM's names, help strings,
labels and buckets, and nothing observed for a stream closed before it finished."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

import pytest

from local_tier.iterators import aclose
from local_tier.jax.api import GenerationOutput
from local_tier.worker.metrics import WorkerMetrics, token_buckets

MODEL = "m"
LABELS = {"engine": "0", "model_name": MODEL}
ARRIVED = 100.0
PHASES = (
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_time_per_output_token_seconds",
)


def out(
    tokens: int, finish: str | None = None, scheduled: float | None = 100.5, completion: int = 0
) -> GenerationOutput:
    return GenerationOutput(
        text="x" * tokens,
        token_ids=list(range(tokens)),
        finish_reason=finish,
        prompt_tokens=7,
        completion_tokens=completion,
        scheduled_at=scheduled,
    )


async def _stream(items: list[GenerationOutput]) -> AsyncIterator[GenerationOutput]:
    for item in items:
        yield item


def drive(
    items: list[GenerationOutput],
    clock: Iterable[float],
    max_model_len: int | None = 100,
    take: int | None = None,
) -> WorkerMetrics:
    """Feed ``items`` through ``timed()``; the clock gives one reading per output. ``take``
    stops after that many outputs and closes the stream, like a client going away."""
    metrics = WorkerMetrics(
        MODEL, lambda: None, max_model_len=max_model_len, now=iter(clock).__next__
    )

    async def consume() -> None:
        timed = metrics.timed(_stream(items), ARRIVED)
        seen = 0
        async for _ in timed:
            seen += 1
            if take is not None and seen >= take:
                break
        await aclose(timed)

    asyncio.run(consume())
    return metrics


def stat(metrics: WorkerMetrics, name: str, suffix: str) -> float | None:
    return metrics.registry.get_sample_value(f"{name}_{suffix}", LABELS)


def observed(metrics: WorkerMetrics, name: str) -> tuple[float | None, float | None]:
    """(count, sum) of one histogram."""
    return stat(metrics, name, "count"), stat(metrics, name, "sum")


def test_finished_request_observes_every_phase_exactly() -> None:
    # scheduled 100.5; tokens at 101.0 (1), 101.5 (2), 103.0 (1, finish): 4 tokens
    items = [out(1), out(2), out(1, "length", completion=4)]
    m = drive(items, [101.0, 101.5, 103.0])
    assert observed(m, "vllm:request_queue_time_seconds") == (1, 0.5)
    assert observed(m, "vllm:request_prefill_time_seconds") == (1, 0.5)
    assert observed(m, "vllm:request_decode_time_seconds") == (1, 2.0)
    assert observed(m, "vllm:request_inference_time_seconds") == (1, 2.5)
    assert observed(m, "vllm:request_time_per_output_token_seconds") == (1, 2.0 / 3)
    assert observed(m, "vllm:e2e_request_latency_seconds") == (1, 3.0)
    assert observed(m, "vllm:time_to_first_token_seconds") == (1, 1.0)
    assert observed(m, "vllm:request_prompt_tokens") == (1, 7)
    assert observed(m, "vllm:request_generation_tokens") == (1, 4)
    assert observed(m, "vllm:request_max_num_generation_tokens") == (1, 4)


def test_one_token_request_observes_zero_time_per_output_token() -> None:
    m = drive([out(1, "length", completion=1)], [102.0])
    assert observed(m, "vllm:request_time_per_output_token_seconds") == (1, 0.0)
    assert observed(m, "vllm:request_decode_time_seconds") == (1, 0.0)
    assert observed(m, "vllm:request_prefill_time_seconds") == (1, 1.5)
    assert observed(m, "vllm:request_inference_time_seconds") == (1, 1.5)


def test_scheduled_at_is_taken_from_the_first_output_that_has_it() -> None:
    items = [out(1, scheduled=None), out(1, "stop", scheduled=100.25, completion=2)]
    m = drive(items, [101.0, 102.0])
    assert observed(m, "vllm:request_queue_time_seconds") == (1, 0.25)
    items = [out(1, scheduled=100.25), out(1, "stop", scheduled=999.0, completion=2)]
    m = drive(items, [101.0, 102.0])
    assert observed(m, "vllm:request_queue_time_seconds") == (1, 0.25)


def test_closed_stream_observes_no_phase() -> None:
    items = [out(1), out(1), out(1, "length", completion=3)]
    m = drive(items, [101.0, 102.0, 103.0], take=2)
    for name in (*PHASES, "vllm:e2e_request_latency_seconds", "vllm:request_prompt_tokens"):
        assert observed(m, name) == (0, 0), name
    assert observed(m, "vllm:time_to_first_token_seconds") == (1, 1.0)  # per token, as before


def test_engine_without_scheduled_at_observes_only_token_phases() -> None:
    items = [out(1, scheduled=None), out(1, "stop", scheduled=None, completion=2)]
    m = drive(items, [101.0, 102.0])
    for name in PHASES[:2] + PHASES[3:4]:  # queue, prefill, inference
        assert observed(m, name) == (0, 0), name
    assert observed(m, "vllm:request_decode_time_seconds") == (1, 1.0)
    assert observed(m, "vllm:request_time_per_output_token_seconds") == (1, 1.0)


def test_finish_without_tokens_observes_only_queue_time() -> None:
    m = drive([out(0, "abort")], [101.0])
    assert observed(m, "vllm:request_queue_time_seconds") == (1, 0.5)
    for name in PHASES[1:]:
        assert observed(m, name) == (0, 0), name
    assert observed(m, "vllm:request_generation_tokens") == (1, 0)


def test_token_histograms_need_max_model_len() -> None:
    m = drive([out(1, "stop", completion=1)], [101.0], max_model_len=None)
    assert m.token_counts is None
    assert stat(m, "vllm:request_prompt_tokens", "count") is None
    assert observed(m, "vllm:request_queue_time_seconds") == (1, 0.5)


@pytest.mark.parametrize(
    ("cap", "expected"),
    [
        (100, (1, 2, 5, 10, 20, 50, 100)),
        (2048, (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)),
        (1, (1,)),
    ],
)
def test_token_buckets_are_vllms_1_2_5_series(cap: int, expected: tuple[int, ...]) -> None:
    assert token_buckets(cap) == tuple(float(b) for b in expected)


def test_exposition_uses_vllms_help_labels_and_buckets() -> None:
    text = drive([out(1, "stop", completion=1)], [101.0]).render().decode()
    helps = {
        "vllm:request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
        "vllm:request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
        "vllm:request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
        "vllm:request_inference_time_seconds": (
            "Histogram of time spent in RUNNING phase for request."
        ),
        "vllm:request_time_per_output_token_seconds": (
            "Histogram of time_per_output_token_seconds per request."
        ),
        "vllm:request_prompt_tokens": "Number of prefill tokens processed.",
        "vllm:request_generation_tokens": "Number of generation tokens processed.",
        "vllm:request_max_num_generation_tokens": (
            "Histogram of maximum number of requested generation tokens."
        ),
    }
    for name, help_text in helps.items():
        assert f"# HELP {name} {help_text}\n# TYPE {name} histogram" in text
    queue = [line for line in text.splitlines() if "queue_time_seconds_bucket" in line]
    assert [line.split('le="')[1].split('"')[0] for line in queue] == [
        *(str(b) for b in (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0)),
        *(str(b) for b in (30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0)),
        "7680.0",
        "+Inf",
    ]
    assert all('engine="0"' in line and f'model_name="{MODEL}"' in line for line in queue)
    tpot = [line for line in text.splitlines() if "request_time_per_output_token_seconds_b" in line]
    assert tpot[0].startswith('vllm:request_time_per_output_token_seconds_bucket{engine="0",le=')
    assert len(tpot) == 20 and 'le="0.01"' in tpot[0] and 'le="80.0"' in tpot[-2]
