"""The OpenAI <-> engine conversions of ``local_tier.serving`` (no model, no HTTP)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import msgspec
import pytest

from core.errors import (
    ContextLengthError,
    InvalidRequestError,
    UpstreamRateLimitedError,
    UpstreamServerError,
)
from core.wire import ChatRequest, CompletionRequest, encoder
from local_tier import iterators, serving
from local_tier.jax.api import (
    EngineOverloadedError,
    EngineRequestError,
    GenerationOutput,
    SamplingParams,
)
from tests.unit.jax_fake import FakeEngine

META = serving.ResponseMeta("chatcmpl-1", 1700000000, "fake-model")


def chat(**fields: object) -> ChatRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return msgspec.convert(body, ChatRequest)


def completion(**fields: object) -> CompletionRequest:
    return msgspec.convert({"model": "m", "prompt": "hi", **fields}, CompletionRequest)


async def outputs(*items: GenerationOutput) -> AsyncIterator[GenerationOutput]:
    for item in items:
        yield item


def out(text: str, reason: str | None = None, completion: int = 1) -> GenerationOutput:
    return GenerationOutput(text, [1] * len(text), reason, 7, completion, 4)


# ---------------------------------------------------------------- requests
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
    ],
)
def test_unsupported_features_are_rejected_with_param(fields: dict[str, object], param: str):
    with pytest.raises(InvalidRequestError) as info:
        serving.check_chat_features(chat(**fields))
    assert info.value.param == param
    assert info.value.status == 400


def test_supported_features_pass():
    tools = [{"type": "function", "function": {"name": "f"}}]
    serving.check_chat_features(
        chat(
            n=1,
            tools=tools,
            tool_choice="none",
            response_format={"type": "text"},
            presence_penalty=0,
        )
    )


def test_template_messages_keep_text_and_rename_developer():
    req = chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": None},
        ]
    )
    assert serving.template_messages(req.messages) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": ""},
    ]


def test_images_are_rejected():
    image = {"type": "image_url", "image_url": {"url": "data:x"}}
    req = chat(messages=[{"role": "user", "content": [image]}])
    with pytest.raises(InvalidRequestError) as info:
        serving.template_messages(req.messages)
    assert info.value.param == "messages"


def test_check_fit_names_the_field_at_fault():
    serving.check_fit(10, 6, 16, ("messages", "max_tokens"))
    serving.check_fit(10, None, 16, ("messages", "max_tokens"))
    with pytest.raises(ContextLengthError) as info:
        serving.check_fit(16, None, 16, ("messages", "max_tokens"))
    assert info.value.param == "messages"
    with pytest.raises(ContextLengthError) as info:
        serving.check_fit(10, 7, 16, ("prompt", "max_completion_tokens"))
    assert info.value.param == "max_completion_tokens"
    assert "7 > 16 - 10" in info.value.message
    assert info.value.code == "context_length_exceeded"


def test_sampling_params_defaults_follow_openai():
    assert serving.sampling_params(None, None, None, [], None) == SamplingParams(
        max_tokens=None, temperature=1.0, top_p=1.0, top_k=0, seed=None, stop=()
    )
    got = serving.sampling_params(5, 0.0, 0.5, ["\n"], 3, top_k=40)
    assert got == SamplingParams(5, 0.0, 0.5, 40, 3, ("\n",))


def test_chat_generation_renders_template_and_maps_fields():
    engine = FakeEngine(max_model_len=64)
    req = chat(max_tokens=3, max_completion_tokens=5, temperature=0, seed=9, stop="x", top_k=2)
    gen = serving.chat_generation(engine, req, "r1")
    assert gen.request_id == "r1"
    assert engine.tokenizer.decode(gen.prompt_token_ids) == "<user>hi\n<assistant>"
    assert gen.params == SamplingParams(5, 0.0, 1.0, 2, 9, ("x",))


def test_chat_generation_length_errors():
    engine = FakeEngine(max_model_len=24)
    with pytest.raises(ContextLengthError) as info:
        serving.chat_generation(engine, chat(max_completion_tokens=10), "r")
    assert info.value.param == "max_completion_tokens"
    long = chat(messages=[{"role": "user", "content": "x" * 40}])
    with pytest.raises(ContextLengthError) as info:
        serving.chat_generation(engine, long, "r")
    assert info.value.param == "messages"


def test_template_refusal_is_a_client_error():
    req = chat(messages=[{"role": "assistant", "content": "hi"}])
    with pytest.raises(InvalidRequestError) as info:
        serving.chat_generation(FakeEngine(), req, "r")
    assert info.value.param == "messages"


@pytest.mark.parametrize(
    ("prompt", "ids"),
    [("ab", [97, 98]), (["ab"], [97, 98]), ([5, 6], [5, 6]), ([[5, 6]], [5, 6])],
)
def test_completion_prompt_forms(prompt: object, ids: list[int]):
    gen = serving.completion_generation(FakeEngine(), completion(prompt=prompt), "c")
    assert gen.prompt_token_ids == ids
    assert gen.params.max_tokens == serving.DEFAULT_COMPLETION_TOKENS


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"n": 3}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 255}, "max_tokens"),
    ],
)
def test_completion_rejections(fields: dict[str, object], param: str):
    with pytest.raises(InvalidRequestError) as info:
        serving.completion_generation(FakeEngine(max_model_len=256), completion(**fields), "c")
    assert info.value.param == param


# ---------------------------------------------------------------- errors
def test_engine_errors_map_to_core_errors():
    with pytest.raises(ContextLengthError) as ctx_info, serving.engine_errors("p"):
        raise EngineRequestError("too long", "prompt", "context_length_exceeded")
    assert ctx_info.value.param == "prompt"
    with pytest.raises(InvalidRequestError) as bad, serving.engine_errors("p"):
        raise EngineRequestError("bad temperature", "temperature")
    assert type(bad.value) is InvalidRequestError
    assert bad.value.param == "temperature"
    with pytest.raises(UpstreamRateLimitedError) as busy, serving.engine_errors("p"):
        raise EngineOverloadedError("queue full")
    assert busy.value.retry_after == 1.0
    assert busy.value.provider == "p"


# ---------------------------------------------------------------- responses
@pytest.mark.anyio
async def test_chat_response_joins_text_and_reports_usage():
    answer = await serving.collect(outputs(out("Hel"), out(""), out("lo", "length", 3)))
    response = serving.chat_response(META, answer)
    body = json.loads(encoder.encode(response))
    assert body["object"] == "chat.completion"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"content": "Hello", "role": "assistant"},
            "finish_reason": "length",
            "logprobs": None,
        }
    ]
    assert body["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 3,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 4},
    }


@pytest.mark.anyio
async def test_aborted_or_unfinished_answers_are_server_errors():
    with pytest.raises(UpstreamServerError):
        await serving.collect(outputs(out("a"), out("", "abort")))
    with pytest.raises(UpstreamServerError):
        await serving.collect(outputs(out("a")))


async def chunk_bodies(include_usage: bool) -> list[dict[str, object]]:
    items = outputs(out("Hi"), out(""), out("!", "stop", 2))
    return [
        json.loads(encoder.encode(c)) async for c in serving.chat_chunks(items, META, include_usage)
    ]


@pytest.mark.anyio
async def test_chat_chunks_follow_openais_sequence():
    bodies = await chunk_bodies(include_usage=True)
    choices = [b["choices"] for b in bodies]
    assert choices == [
        [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "finish_reason": None,
                "logprobs": None,
            }
        ],
        [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None, "logprobs": None}],
        [{"index": 0, "delta": {"content": "!"}, "finish_reason": None, "logprobs": None}],
        [{"index": 0, "delta": {}, "finish_reason": "stop", "logprobs": None}],
        [],
    ]
    assert all(b["id"] == "chatcmpl-1" and b["object"] == "chat.completion.chunk" for b in bodies)
    assert "usage" not in bodies[3]
    assert bodies[4]["usage"]["total_tokens"] == 9


@pytest.mark.anyio
async def test_chat_chunks_without_usage_end_with_finish_chunk():
    bodies = await chunk_bodies(include_usage=False)
    assert len(bodies) == 4
    assert all("usage" not in b for b in bodies)


@pytest.mark.anyio
async def test_closing_the_chunks_closes_the_engine_outputs():
    closed = []

    async def engine_outputs() -> AsyncIterator[GenerationOutput]:
        try:
            while True:
                yield out("x")
        finally:
            closed.append(True)

    chunks = serving.chat_chunks(iterators.prepend(out("a"), engine_outputs()), META, False)
    assert (await anext(chunks)).choices[0].delta.role == "assistant"
    await anext(chunks)
    await anext(chunks)
    await chunks.aclose()
    assert closed == [True]


@pytest.mark.anyio
async def test_completion_body_and_stream():
    answer = await serving.collect(outputs(out("ab"), out("c", "stop", 2)))
    body, usage = serving.completion_body(META, answer)
    decoded = json.loads(body)
    assert decoded["object"] == "text_completion"
    assert decoded["choices"] == [
        {"index": 0, "text": "abc", "logprobs": None, "finish_reason": "stop"}
    ]
    assert usage.total_tokens == 9
    parts = [
        p
        async for p in serving.completion_stream(
            outputs(out("ab"), out(""), out("c", "stop", 2)), META, True
        )
    ]
    texts = [json.loads(p.data)["choices"] for p in parts]
    assert [c[0]["text"] for c in texts[:2]] == ["ab", "c"]
    assert [c[0]["finish_reason"] for c in texts[:2]] == [None, "stop"]
    assert texts[2] == []
    assert parts[2].usage is not None and parts[2].usage.cached_tokens == 4


@pytest.mark.anyio
async def test_started_surfaces_the_first_error_and_closes():
    engine = FakeEngine()
    bad = serving.generate(engine, serving.chat_generation(engine, chat(), "r"))
    bad_req = serving.chat_generation(engine, chat(temperature=0), "r2")
    bad_req.params = SamplingParams(temperature=5.0)
    with pytest.raises(InvalidRequestError) as info:
        await iterators.started(serving.generate(engine, bad_req))
    assert info.value.param == "temperature"
    answer = await serving.collect(await iterators.started(bad))
    assert answer.text == engine.reply
    assert engine.finished == ["r"]
    assert engine.aborted == []
