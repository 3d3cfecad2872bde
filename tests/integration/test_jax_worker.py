"""The JAX worker process on the real SmolLM2 model, over real HTTP on 127.0.0.1, driven by
the official ``openai`` SDK: the same API and metric names as vLLM.

The worker starts once per module (``python -m local_tier.worker --port P``) and is stopped
by its PID. Greedy text is not asserted word for word; structure, usage and metrics are.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from tests.fixtures.server import free_port

pytestmark = [pytest.mark.model, pytest.mark.timeout(900)]

MODEL = "smollm2-test"
MAX_LEN = 1024
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Worker:
    url: str
    proc: subprocess.Popen[bytes]
    client: openai.OpenAI

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10).text


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"worker not healthy in {limit} s:\n{log.read_text()[-4000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "local_tier.worker",
        "--port",
        str(port),
        "--served-model-name",
        MODEL,
        "--max-model-len",
        str(MAX_LEN),
        "--max-batch-size",
        "4",
        "--kv-cache-tokens",
        "8192",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "worker.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(url, proc, log, limit=600)
            client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
            yield Worker(url, proc, client)
        finally:
            _stop(proc)
        shutdown = log.read_text()
    # uvicorn re-raises the SIGTERM it handled once the app has shut down gracefully.
    assert proc.returncode in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in shutdown


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def metric(text: str, name: str) -> float:
    lines = [line for line in text.splitlines() if line.startswith(name + "{")]
    assert lines, f"{name} missing from /metrics"
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_chat(worker: Worker):
    reply = worker.client.chat.completions.create(
        model=MODEL, messages=ask("What is the capital of France?"), temperature=0, max_tokens=24
    )
    choice = reply.choices[0]
    assert reply.model == MODEL and choice.message.role == "assistant"
    assert choice.message.content and choice.finish_reason in ("stop", "length")
    counted = httpx.post(
        worker.url + "/tokenize", json={"messages": ask("What is the capital of France?")}
    ).json()
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == counted["count"]
    assert 0 < reply.usage.completion_tokens <= 24


def test_stream(worker: Worker):
    chunks = list(
        worker.client.chat.completions.create(
            model=MODEL,
            messages=ask("Name three colors."),
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_completions(worker: Worker):
    done = worker.client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0
    )
    assert done.object == "text_completion" and done.choices[0].text
    assert done.usage is not None and done.usage.completion_tokens <= 5
    parts = list(
        worker.client.completions.create(
            model=MODEL, prompt="One, two, three,", max_tokens=6, temperature=0, stream=True
        )
    )
    assert "".join(p.choices[0].text for p in parts).strip()
    assert parts[-1].choices[0].finish_reason in ("stop", "length")


def test_models_and_tokenize(worker: Worker):
    models = worker.client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_extra and models[0].model_extra["max_model_len"] == MAX_LEN
    ids = httpx.post(worker.url + "/tokenize", json={"prompt": "Hello world"}).json()["tokens"]
    back = httpx.post(worker.url + "/detokenize", json={"tokens": ids}).json()
    assert back == {"prompt": "Hello world"}


def test_prefix_cache_hits_show_in_usage_and_metrics(worker: Worker):
    before = worker.metrics()
    system = "You are a careful assistant. " + " ".join(f"Rule {i}: be kind." for i in range(40))
    usages = []
    for question in ("Say hi.", "Say bye."):
        reply = worker.client.chat.completions.create(
            model=MODEL,
            max_tokens=4,
            temperature=0,
            messages=[{"role": "system", "content": system}, *ask(question)],
        )
        usages.append(reply.usage)
    assert usages[0] is not None and usages[0].prompt_tokens > 150
    second = usages[1]
    assert second is not None and second.prompt_tokens_details is not None
    assert second.prompt_tokens_details.cached_tokens >= 128
    after = worker.metrics()
    gained = {
        name: metric(after, name) - metric(before, name)
        for name in (
            "vllm:prefix_cache_hits_total",
            "vllm:prefix_cache_queries_total",
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
            "vllm:time_to_first_token_seconds_count",
            "vllm:e2e_request_latency_seconds_count",
            "vllm:inter_token_latency_seconds_count",
        )
    }
    assert gained["vllm:prefix_cache_hits_total"] >= 128
    assert all(value > 0 for value in gained.values()), gained
    for gauge in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        assert metric(after, gauge) >= 0
    assert "vllm:cache_config_info{block_size=" in after


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"messages": ask("hello " * (MAX_LEN + 50))}, "messages"),
        ({"messages": ask("hi"), "max_tokens": MAX_LEN}, "max_tokens"),
        ({"messages": ask("hi"), "temperature": 3.0}, "temperature"),
    ],
)
def test_bad_input_is_400(worker: Worker, kwargs: dict[str, object], param: str):
    with pytest.raises(openai.BadRequestError) as info:
        worker.client.chat.completions.create(model=MODEL, **kwargs)  # type: ignore[call-overload]
    assert info.value.body["param"] == param


def test_unknown_model_is_404(worker: Worker):
    with pytest.raises(openai.NotFoundError):
        worker.client.chat.completions.create(model="gpt-nope", messages=ask("hi"))


def test_cancelled_stream_frees_the_sequence(worker: Worker):
    stream = worker.client.chat.completions.create(
        model=MODEL,
        messages=ask("Write a long story about a dragon."),
        max_tokens=400,
        stream=True,
        temperature=0.7,
        seed=1,
    )
    received = [next(stream) for _ in range(4)]
    assert received[0].choices[0].delta.role == "assistant"
    stream.close()
    deadline = time.monotonic() + 20
    while metric(worker.metrics(), "vllm:num_requests_running") > 0:
        assert time.monotonic() < deadline, "the cancelled sequence is still running"
        time.sleep(0.2)
    reply = worker.client.chat.completions.create(model=MODEL, messages=ask("hi"), max_tokens=3)
    assert reply.choices[0].message.content is not None
    assert worker.proc.poll() is None
