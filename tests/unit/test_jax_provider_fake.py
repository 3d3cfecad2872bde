"""``JaxProvider`` over the fake engine: readiness, shapes, error mapping, deadlines and
cancellation. (tests/integration/test_jax_provider.py runs it on the real model.)"""

from __future__ import annotations

import json

import msgspec
import pytest

from core.config import JaxProviderConfig
from core.errors import (
    ContextLengthError,
    InvalidRequestError,
    UpstreamRateLimitedError,
    UpstreamServerError,
    UpstreamTimeoutError,
)
from core.protocols import CallContext, CompletionProvider, Provider, Timeouts
from core.wire import ChatRequest, CompletionRequest
from local_tier.jax.api import EngineProtocol
from local_tier.provider import JaxProvider
from tests.unit.jax_fake import FakeEngine

CTX = CallContext(request_id="req-1", upstream_model="fake-model")


def provider_for(engine: FakeEngine) -> JaxProvider:
    async def load(_: JaxProviderConfig, __: object) -> EngineProtocol:
        await engine.start()
        return engine

    return JaxProvider("local", JaxProviderConfig(), loader=load)


def chat(**fields: object) -> ChatRequest:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], **fields}
    return msgspec.convert(body, ChatRequest)


@pytest.mark.anyio
async def test_ready_only_after_start_and_closed_by_aclose():
    engine = FakeEngine(max_model_len=256)
    provider = provider_for(engine)
    assert isinstance(provider, Provider) and isinstance(provider, CompletionProvider)
    assert not provider.is_ready()
    with pytest.raises(UpstreamServerError) as info:
        await provider.chat(chat(), CTX)
    assert info.value.provider == "local"
    await provider.start()
    assert provider.is_ready() and engine.started
    caps = provider.capabilities
    assert (caps.max_context, caps.tools, caps.vision, caps.json_schema) == (
        256,
        False,
        False,
        False,
    )
    assert caps.completions and caps.streaming
    await provider.aclose()
    assert engine.stopped and not provider.is_ready()


@pytest.mark.anyio
async def test_chat_and_stream():
    provider = provider_for(FakeEngine(reply="Fine."))
    await provider.start()
    result = await provider.chat(chat(), CTX)
    assert result.response.choices[0].message.content == "Fine."
    assert result.response.usage is not None and result.response.usage.completion_tokens == 5
    parts = [
        p async for p in provider.stream_chat(chat(stream_options={"include_usage": True}), CTX)
    ]
    deltas = [p.chunk.choices[0].delta.content for p in parts if p.chunk.choices]
    assert deltas[0] == "" and "".join(d or "" for d in deltas) == "Fine."
    assert parts[-1].chunk.choices == [] and parts[-1].chunk.usage is not None


@pytest.mark.anyio
async def test_closing_a_stream_aborts_the_sequence():
    engine = FakeEngine(reply="z" * 100, step_s=0.01)
    provider = provider_for(engine)
    await provider.start()
    stream = provider.stream_chat(chat(), CTX)
    await anext(stream)
    await anext(stream)
    await stream.aclose()
    assert len(engine.aborted) == 1 and engine.aborted[0].startswith("req-1-")
    assert engine.stats().num_requests_running == 0


@pytest.mark.anyio
async def test_errors_map_to_core_errors():
    engine = FakeEngine(max_model_len=64)
    provider = provider_for(engine)
    await provider.start()
    with pytest.raises(ContextLengthError) as info:
        await provider.chat(chat(max_tokens=60), CTX)
    assert info.value.param == "max_tokens"
    with pytest.raises(InvalidRequestError) as bad:
        await anext(provider.stream_chat(chat(n=2), CTX))
    assert bad.value.param == "n"
    engine._max_waiting = 0
    with pytest.raises(UpstreamRateLimitedError) as busy:
        await anext(provider.stream_chat(chat(), CTX))
    assert (busy.value.retry_after, busy.value.provider) == (1.0, "local")


@pytest.mark.anyio
async def test_first_token_deadline_aborts_and_times_out():
    engine = FakeEngine(step_s=5.0)
    provider = provider_for(engine)
    await provider.start()
    ctx = CallContext(request_id="r", upstream_model="m", timeouts=Timeouts(first_token=0.05))
    with pytest.raises(UpstreamTimeoutError) as info:
        await provider.chat(chat(), ctx)
    assert info.value.provider == "local"
    assert len(engine.aborted) == 1


@pytest.mark.anyio
async def test_legacy_completions():
    provider = provider_for(FakeEngine(reply="abcdef"))
    await provider.start()
    req = msgspec.convert({"model": "m", "prompt": "x", "max_tokens": 4}, CompletionRequest)
    result = await provider.complete(req, CTX)
    body = json.loads(result.body)
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "abcd"
    assert result.usage is not None and result.usage.completion_tokens == 4
    streamed = msgspec.convert(
        {
            "model": "m",
            "prompt": "x",
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        CompletionRequest,
    )
    parts = [p async for p in provider.stream_complete(streamed, CTX)]
    texts = [c["text"] for p in parts for c in json.loads(p.data)["choices"]]
    assert "".join(texts) == "abc"
    assert parts[-1].usage is not None and parts[-1].usage.total_tokens == 4


@pytest.mark.anyio
async def test_the_call_priority_reaches_the_engine():
    engine = FakeEngine(reply="ok")
    provider = provider_for(engine)
    await provider.start()
    await provider.chat(chat(), CTX)
    batch_ctx = CallContext(request_id="req-2", upstream_model="fake-model", priority=1)
    await provider.chat(chat(), batch_ctx)
    assert [r.priority for r in engine.requests] == [0, 1]
