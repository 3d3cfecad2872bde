"""bench.routing_e2e: the fake upstreams' wire format, the local box's slot queue, the
outage hang, and a tiny trace through real gateway processes (compressed latencies)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import httpx
import pytest

from bench.routing_e2e import report
from bench.routing_e2e.__main__ import build_report
from bench.routing_e2e.health import FIELDS
from bench.routing_e2e.menu import MENU
from bench.routing_e2e.runner import Settings, run_group
from bench.routing_e2e.upstream import FakeUpstream
from bench.routing_e2e.wire import TOKENS_PER_MESSAGE
from bench.routing_e2e.workload import make_trace, prompt_text

pytestmark = pytest.mark.anyio


def _body(key: str, tokens: int = 40, max_tokens: int = 5, stream: bool = True) -> dict:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": prompt_text(key, tokens)}],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": {"include_usage": True},
        "user": key,
    }


async def _until(check, timeout_s: float = 10.0) -> None:
    """Poll ``check`` until it is true (a state condition, not a timing assertion)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_stream_is_openai_wire_format_with_usage():
    up = await FakeUpstream(MENU["premium"], seed=1, scale=0.01).start()
    try:
        async with httpx.AsyncClient() as client:
            r = await client.post(up.url + "/v1/chat/completions", json=_body("k1", 40, 7))
            models = (await client.get(up.url + "/v1/models")).json()
            whole = (
                await client.post(up.url + "/v1/chat/completions", json=_body("k2", stream=False))
            ).json()
    finally:
        await up.stop()
    assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
    events = [e[len("data: ") :] for e in r.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 40
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert len(text) // 4 == chunks[-1]["usage"]["completion_tokens"]
    assert models["data"][0]["id"] == "premium"
    assert whole["object"] == "chat.completion" and whole["usage"]["prompt_tokens"] == 40
    assert up.stats.served[0].prompt_tokens == 40


async def test_local_box_fifth_concurrent_request_waits_for_a_slot():
    slow = replace(MENU["local"], ttft_median_s=0.3, ttft_sigma=0.0, decode_s_per_token=0.05)
    up = await FakeUpstream(slow, seed=1).start()
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            posts = [
                asyncio.create_task(
                    client.post(up.url + "/v1/chat/completions", json=_body(f"q{i}", max_tokens=10))
                )
                for i in range(5)
            ]
            await _until(lambda: up.running == 4 and up.waiting == 1)
            page = (await client.get(up.url + "/metrics")).text
            assert "vllm:num_requests_running" in page and "vllm:num_requests_waiting" in page
            running = [ln for ln in page.splitlines() if ln.startswith("vllm:num_requests_running")]
            waiting = [ln for ln in page.splitlines() if ln.startswith("vllm:num_requests_waiting")]
            assert running[0].endswith(" 4.0") and waiting[0].endswith(" 1.0")
            answers = await asyncio.gather(*posts)
    finally:
        await up.stop()
    assert all(a.status_code == 200 for a in answers)
    assert up.running == 0 and up.waiting == 0 and up.stats.high_water == 5


async def test_outage_hangs_without_headers_and_bills_the_prompt():
    up = await FakeUpstream(MENU["mid"], seed=1, scale=0.01).start()
    now = asyncio.get_running_loop().time()
    up.set_outage(now, now + 60)
    try:
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post(up.url + "/v1/chat/completions", json=_body("h1"), timeout=0.3)
            await _until(lambda: up.stats.in_flight == 0)
    finally:
        await up.stop()
    (record,) = up.stats.served
    assert record.outcome == "hung" and record.prompt_tokens == 40 and not record.first_token


def test_trace_prompts_match_the_gateway_estimate():
    trace = make_trace(7, 50, 5.0)
    for req in trace:
        text = prompt_text(req.key, req.prompt_tokens)
        assert len(text) // 4 + TOKENS_PER_MESSAGE == req.prompt_tokens
    assert make_trace(7, 50, 5.0) == trace


async def test_tiny_trace_through_real_gateways(tmp_path):
    settings = Settings(
        seeds=(3,),
        requests=12,
        rate=30.0,
        feeds=("metrics",),
        policies=("priority", "slo"),
        outage_s=0.0,  # no hang: a hung request would wait the gateway's 60 s timeout
        scale=0.05,
        client_timeout_s=20.0,
        workdir=tmp_path,
    )
    runs = await run_group(3, "metrics", settings)
    for run in runs:
        records = {
            s.key: s for stats in run.upstreams.values() for s in stats.served if s.outcome == "ok"
        }
        for req, out in zip(run.trace, run.outcomes, strict=True):
            assert out.ok and out.status == 200 and out.ttft_s is not None, out.error
            served = records[req.key]
            assert out.usage["prompt_tokens"] == served.prompt_tokens == req.prompt_tokens
            assert out.usage["completion_tokens"] == served.completion_tokens
            assert out.provider in run.upstreams
        # the health timeline: the admin key works, every target is seen, as the strategy is
        polled = {sample.target.split("/")[0] for sample in run.health}
        assert polled == set(run.upstreams), polled
        assert all(set(sample.health) == set(FIELDS) for sample in run.health)
        assert all(sample.health["breaker"] == "closed" for sample in run.health)
    result = build_report(settings, runs)
    for policy in ("priority", "slo"):
        agg = result["aggregate"][f"metrics/{policy}"]
        assert agg["requests"] == 12 and agg["errors"] == 0
        assert set(agg["classes"]) == {"chat-800ms", "chat-3s", "rag-3s", "overall", "none"}
        for key in ("cost_per_1k", "ttft_s", "goodput_rps", "outage", "share"):
            assert key in agg
    assert result["verdicts"][0]["feed"] == "metrics"
    (paired,) = result["excess_misses"]  # slo's misses, paired with priority's
    by_policy = {m["policy"]: len(m["misses"]) for m in result["per_seed"]}
    assert paired["both"] + sum(paired["policy_only"].values()) == by_policy["slo"]
    assert paired["both"] + paired["baseline_only"] == by_policy["priority"]
    assert "metrics/slo" in report.table(result["aggregate"])
