"""End to end with the real local model: the openai SDK -> the gateway -> the in-process JAX
engine running SmolLM2-135M-Instruct on the CPU (what `make serve` ships)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from tests.integration.gateway_harness import Gateway, running_gateway

pytestmark = [pytest.mark.model, pytest.mark.anyio, pytest.mark.timeout(900)]

CONFIG = """
providers:
  local: {type: jax, dtype: float32, max_batch_size: 4, max_model_len: 512, kv_cache_tokens: 4096}
models:
  smollm2: {targets: [{provider: local, model: smollm2-135m-instruct}]}
"""
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def started() -> Iterator[tuple[Gateway, int]]:
    with running_gateway(CONFIG, env={}) as gateway:
        early = httpx.get(gateway.url + "/readyz").status_code
        deadline = time.monotonic() + 600
        while httpx.get(gateway.url + "/readyz").status_code != 200:
            assert time.monotonic() < deadline, "local model did not become ready"
            time.sleep(0.5)
        yield gateway, early


@pytest.fixture
def client(started) -> openai.OpenAI:
    return openai.OpenAI(base_url=started[0].base_url, api_key="unused", max_retries=0)


def test_ready_only_after_the_model_answered_a_probe(started):
    gateway, early_status = started
    assert early_status == 503  # loading and compiling takes seconds: not ready at once
    body = httpx.get(gateway.url + "/readyz").json()
    assert body == {"status": "ready", "providers": {"local": True}, "disabled": {}}


def test_greedy_answer_is_exact(client):
    reply = client.chat.completions.create(
        model="smollm2", messages=FRANCE, temperature=0, max_tokens=32
    )
    assert reply.choices[0].message.content == "The capital of France is Paris."
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens == 37


def test_stream_gives_the_same_text(client):
    chunks = list(
        client.chat.completions.create(
            model="smollm2",
            messages=FRANCE,
            temperature=0,
            max_tokens=32,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The capital of France is Paris."
    assert chunks[-1].usage.completion_tokens > 0


def test_local_errors_are_openai_shaped(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="smollm2", messages=FRANCE, max_tokens=100_000)
    assert info.value.body["param"] in ("max_tokens", "max_completion_tokens")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="smollm2",
            messages=FRANCE,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )


def test_the_anthropic_sdk_reaches_the_local_model(started):
    claude = anthropic.Anthropic(base_url=started[0].url, api_key="unused", max_retries=0)
    # This SDK no longer takes ``temperature`` as an argument; the wire field still exists.
    greedy = {"temperature": 0}
    message = claude.messages.create(
        model="smollm2", messages=FRANCE, max_tokens=32, extra_body=greedy
    )
    assert message.content[0].text == "The capital of France is Paris."
    assert message.stop_reason == "end_turn"
    # Anthropic counts cached input apart: the engine's prefix cache holds this prompt from
    # the tests before, and input_tokens + cache_read_input_tokens is the whole prompt.
    usage = message.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == 37
    with claude.messages.stream(
        model="smollm2", messages=FRANCE, max_tokens=32, extra_body=greedy
    ) as stream:
        assert "".join(stream.text_stream) == "The capital of France is Paris."


def test_the_responses_api_reaches_the_local_model(client):
    response = client.responses.create(
        model="smollm2", input=FRANCE[0]["content"], temperature=0, max_output_tokens=32
    )
    assert response.output_text == "The capital of France is Paris."
    with client.responses.stream(
        model="smollm2", input=FRANCE[0]["content"], temperature=0, max_output_tokens=32
    ) as stream:
        final = stream.get_final_response()
    assert final.output_text == "The capital of France is Paris."
