"""``JaxProvider`` in-process on the real SmolLM2 model: the event loop stays free while the
model loads, readiness follows the probe, chat and stream answer, closing a stream frees the
sequence. One engine per module (loading and compiling it is the slow part)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import msgspec
import pytest

from core.config import JaxProviderConfig
from core.errors import ContextLengthError
from core.protocols import CallContext
from core.wire import ChatRequest
from local_tier.provider import JaxProvider

pytestmark = [pytest.mark.model, pytest.mark.timeout(900), pytest.mark.anyio]

CONFIG = JaxProviderConfig(
    served_model_name="smollm2-test", max_model_len=1024, max_batch_size=4, kv_cache_tokens=8192
)
CTX = CallContext(request_id="it-1", upstream_model="smollm2-test")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module scope: the engine's loop lives as long as the module's fixture


@pytest.fixture(scope="module")
async def provider(anyio_backend: str) -> AsyncIterator[JaxProvider]:
    progress: list[str] = []
    provider = JaxProvider("local", CONFIG, progress=progress.append)
    loading = asyncio.create_task(provider.start())
    # While the weights load in a thread, the loop keeps answering (like /healthz would).
    lags = []
    while not loading.done():
        assert not provider.is_ready()
        started = time.monotonic()
        await asyncio.sleep(0.05)
        lags.append(time.monotonic() - started - 0.05)
    await loading
    assert provider.is_ready() and progress
    assert lags and sorted(lags)[len(lags) // 2] < 0.5  # median: loop not blocked
    yield provider
    await provider.aclose()
    assert not provider.is_ready()


def chat(text: str, **fields: object) -> ChatRequest:
    body = {"model": "smollm2-test", "messages": [{"role": "user", "content": text}], **fields}
    return msgspec.convert(body, ChatRequest)


async def test_capabilities(provider: JaxProvider):
    caps = provider.capabilities
    assert caps.max_context == 1024 and caps.completions and caps.streaming
    assert not (caps.tools or caps.vision or caps.json_schema)


async def test_chat(provider: JaxProvider):
    result = await provider.chat(chat("What is the capital of France?", temperature=0), CTX)
    response = result.response
    assert response.choices[0].message.content
    assert response.choices[0].finish_reason in ("stop", "length")
    assert response.usage is not None and response.usage.prompt_tokens > 10


async def test_stream(provider: JaxProvider):
    req = chat("Count to five.", max_tokens=16, stream_options={"include_usage": True})
    parts = [p async for p in provider.stream_chat(req, CTX)]
    assert parts[0].chunk.choices[0].delta.role == "assistant"
    text = "".join(p.chunk.choices[0].delta.content or "" for p in parts if p.chunk.choices)
    assert text.strip()
    usage = parts[-1].chunk.usage
    assert usage is not None and 0 < usage.completion_tokens <= 16


async def test_closing_the_stream_cancels_the_sequence(provider: JaxProvider):
    engine = provider.engine
    assert engine is not None
    stream = provider.stream_chat(chat("Tell a long story.", max_tokens=400), CTX)
    for _ in range(4):
        await anext(stream)
    assert engine.stats().num_requests_running == 1
    await stream.aclose()
    deadline = time.monotonic() + 10
    while engine.stats().num_requests_running:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    result = await provider.chat(chat("hi", max_tokens=2), CTX)
    assert result.response.usage is not None


async def test_too_long_is_a_context_error(provider: JaxProvider):
    with pytest.raises(ContextLengthError) as info:
        await provider.chat(chat("hi", max_tokens=5000), CTX)
    assert info.value.param == "max_tokens"
