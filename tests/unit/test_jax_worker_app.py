"""The worker's HTTP layer over a fake engine, on real HTTP with the official ``openai`` SDK:
statuses, shapes, metrics, readiness and client disconnects. (The real model is exercised
in tests/integration/test_jax_worker.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

from core.config import JaxProviderConfig
from local_tier.jax.api import EngineProtocol
from local_tier.worker.app import create_app
from local_tier.worker.state import WorkerState
from tests.fixtures.server import serve
from tests.unit.jax_fake import FakeEngine

MODEL = "fake-model"
CONFIG = JaxProviderConfig(served_model_name=MODEL, max_model_len=256)


class Harness:
    def __init__(self, engine: FakeEngine, url: str, gate: threading.Event) -> None:
        self.engine, self.url, self.gate = engine, url, gate
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        self.fatal: list[BaseException] = []

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10)

    def post(self, path: str, body: dict[str, object]) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=10)


def gated_loader(engine: FakeEngine, gate: threading.Event) -> Callable[..., object]:
    async def load(_: JaxProviderConfig) -> EngineProtocol:
        while not gate.is_set():  # the "model" loads until the test opens the gate
            await asyncio.sleep(0.01)
        return engine

    return load


@contextlib.contextmanager
def worker(engine: FakeEngine, ready: bool = True) -> Iterator[Harness]:
    gate = threading.Event()
    if ready:
        gate.set()
    fatal: list[BaseException] = []
    state = WorkerState(CONFIG, gated_loader(engine, gate), on_fatal=fatal.append)
    with serve(create_app(state)) as server:
        harness = Harness(engine, server.url, gate)
        harness.fatal = fatal
        if ready:
            wait_for(lambda: harness.get("/health").status_code == 200)
        yield harness
    assert engine.stopped  # shutdown stops the engine


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def w() -> Iterator[Harness]:
    with worker(FakeEngine(reply="Hello there, friend.", step_s=0.002)) as harness:
        yield harness


def user(text: str = "hi") -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


# ---------------------------------------------------------------- happy paths
def test_chat_answers_with_openai_shape(w: Harness):
    reply = w.client.chat.completions.create(model=MODEL, messages=user(), max_tokens=5)
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == "Hello"
    assert reply.choices[0].finish_reason == "length"
    assert reply.model == MODEL
    assert reply.usage is not None
    prompt_len = len("<user>hi\n<assistant>")
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (prompt_len, 5)


def test_vllm_priority_field_reaches_the_engine(w: Harness):
    w.client.chat.completions.create(
        model=MODEL, messages=user("later"), max_tokens=2, extra_body={"priority": 3}
    )
    w.client.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert [r.priority for r in w.engine.requests[-2:]] == [3, 0]


def test_chat_stream_sequence_with_usage(w: Harness):
    stream = w.client.chat.completions.create(
        model=MODEL,
        messages=user("stream"),
        stream=True,
        stream_options={"include_usage": True},
        stop=[","],
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello there"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert len({c.id for c in chunks}) == 1


def test_completions_plain_and_streamed(w: Harness):
    done = w.client.completions.create(model=MODEL, prompt="Say", max_tokens=3)
    assert done.choices[0].text == "Hel"
    assert done.choices[0].finish_reason == "length"
    assert done.usage is not None and done.usage.prompt_tokens == 3
    parts = list(
        w.client.completions.create(
            model=MODEL,
            prompt=[1, 2, 3],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(p.choices[0].text for p in parts if p.choices) == "Hell"
    assert parts[-1].usage is not None and parts[-1].usage.total_tokens == 7


def test_models_tokenize_detokenize(w: Harness):
    models = w.client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    tokens = w.post("/tokenize", {"model": MODEL, "prompt": "abc"}).json()
    assert tokens == {"count": 3, "max_model_len": 256, "tokens": [97, 98, 99], "token_strs": None}
    chat = w.post("/tokenize", {"messages": user("x")}).json()
    assert chat["count"] == len("<user>x\n<assistant>")
    assert w.post("/detokenize", {"tokens": [104, 105]}).json() == {"prompt": "hi"}


# ---------------------------------------------------------------- errors
def test_unknown_model_is_404(w: Harness):
    with pytest.raises(openai.NotFoundError) as info:
        w.client.chat.completions.create(model="nope", messages=user())
    assert info.value.body["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"messages": user("x" * 300)}, "messages"),
        ({"messages": user(), "max_tokens": 250}, "max_tokens"),
        ({"messages": user(), "temperature": 5}, "temperature"),
        ({"messages": user(), "n": 2}, "n"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ],
)
def test_bad_requests_are_400_with_param(w: Harness, kwargs: dict[str, object], param: str):
    with pytest.raises(openai.BadRequestError) as info:
        w.client.chat.completions.create(model=MODEL, **kwargs)  # type: ignore[call-overload]
    assert info.value.status_code == 400
    assert info.value.body["param"] == param


def test_malformed_json_is_400(w: Harness):
    response = httpx.post(w.url + "/v1/chat/completions", content=b"{nope", timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_full_queue_is_429_with_retry_after(w: Harness):
    w.engine._max_waiting = 0
    try:
        response = w.post("/v1/chat/completions", {"model": MODEL, "messages": user()})
    finally:
        w.engine._max_waiting = 4
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"


# ---------------------------------------------------------------- metrics
def metric(text: str, name: str) -> float:
    lines = [line for line in text.splitlines() if line.startswith(name)]
    assert lines, f"{name} missing"
    return float(lines[0].rsplit(" ", 1)[1])


def test_metrics_use_vllm_names_and_move(w: Harness):
    before = w.get("/metrics").text
    prefix = "p" * 40
    for _ in range(2):
        w.client.chat.completions.create(model=MODEL, messages=user(prefix), max_tokens=2)
    after = w.get("/metrics").text
    labelled = '{engine="0",model_name="fake-model"}'
    for name in (
        "prompt_tokens_total",
        "generation_tokens_total",
        "prefix_cache_hits_total",
        "prefix_cache_queries_total",
        "e2e_request_latency_seconds_count",
        "time_to_first_token_seconds_count",
        "inter_token_latency_seconds_count",
    ):
        full = f"vllm:{name}{labelled}"
        assert metric(after, full) > metric(before, full), name
    assert metric(after, f"vllm:num_requests_running{labelled}") == 0
    assert metric(after, f"vllm:kv_cache_usage_perc{labelled}") == 0
    assert (
        'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",'
        'num_gpu_blocks="64"} 1.0'
    ) in after
    success = [
        line
        for line in after.splitlines()
        if line.startswith("vllm:request_success_total{") and '"length"' in line
    ]
    assert len(success) == 1 and float(success[0].rsplit(" ", 1)[1]) >= 2


# ---------------------------------------------------------------- lifecycle
def test_health_is_503_until_the_model_is_ready():
    with worker(FakeEngine(), ready=False) as h:
        assert h.get("/health").status_code == 503
        with pytest.raises(openai.InternalServerError) as info:
            h.client.chat.completions.create(model=MODEL, messages=user())
        assert info.value.status_code == 503
        h.gate.set()
        wait_for(lambda: h.get("/health").status_code == 200)


def test_a_failed_load_is_fatal():
    async def broken(_: JaxProviderConfig) -> EngineProtocol:
        raise RuntimeError("no weights")

    fatal: list[BaseException] = []
    with serve(create_app(WorkerState(CONFIG, broken, on_fatal=fatal.append))) as server:
        wait_for(lambda: bool(fatal))
        assert httpx.get(server.url + "/health").status_code == 503
    assert isinstance(fatal[0], RuntimeError)


def test_client_disconnects_abort_the_sequence():
    engine = FakeEngine(reply="z" * 200, step_s=0.02)
    with worker(engine) as h:
        body = {"model": MODEL, "messages": user("a"), "stream": True}
        with httpx.stream("POST", h.url + "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
        wait_for(lambda: len(engine.aborted) == 1)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(h.url + "/v1/chat/completions", json={**body, "stream": False}, timeout=0.3)
        wait_for(lambda: len(engine.aborted) == 2)
        reply = h.client.chat.completions.create(model=MODEL, messages=user(), max_tokens=2)
        assert reply.choices[0].message.content == "zz"
        assert engine.stats().num_requests_running == 0
