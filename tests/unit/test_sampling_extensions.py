"""vLLM's sampling extensions without a model: the host-side logits processors
(``min_tokens``, ``repetition_penalty``), stop-string rules (``include_stop_str_in_output``,
``min_tokens``) against a transcription of vLLM's algorithm, the checks, and the way the
serving layer, the worker and the in-process provider read the fields from a body.
(tests/integration/test_jax_sampling_extensions.py runs them on the real model.)"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, cast

import msgspec
import numpy as np
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.config import JaxProviderConfig
from core.errors import InvalidRequestError
from core.protocols import CallContext
from core.wire import ChatRequest, CompletionRequest
from local_tier import serving
from local_tier.jax.api import EngineProtocol, EngineRequestError, SamplingParams
from local_tier.jax.detokenizer import StopFilter
from local_tier.jax.sampling import Sampler, apply_repetition_penalty, check_params
from local_tier.provider import JaxProvider
from local_tier.vllm_extensions import vllm_extensions
from tests.unit.jax_fake import FakeEngine
from tests.unit.test_jax_worker_app import MODEL, Harness, user, worker

EOS = 3
GREEDY = SamplingParams(temperature=0.0)
MESSAGES: Any = user()


# ---------------------------------------------------------------- repetition penalty
def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    logits = np.array([2.0, -1.0, 0.0, 3.0, -2.0])
    seen = np.array([True, True, True, False, False])
    apply_repetition_penalty(logits, seen, 2.0)
    assert logits.tolist() == [1.0, -2.0, 0.0, 3.0, -2.0]  # unseen ids untouched
    apply_repetition_penalty(logits, seen, 0.5)  # < 1 favours repeats
    assert logits.tolist() == [2.0, -1.0, 0.0, 3.0, -2.0]


def test_penalty_counts_prompt_and_output_ids_and_changes_greedy_choice() -> None:
    logits = np.array([0.0, 2.0, 1.9, 1.8, -5.0], dtype=np.float32)
    plain = Sampler(GREEDY, prompt_ids=[1])
    assert plain.sample(logits) == 1
    s = Sampler(msgspec.structs.replace(GREEDY, repetition_penalty=1.2), prompt_ids=[1])
    assert s.sample(logits) == 2  # 2.0 / 1.2 < 1.9
    assert s.sample(logits, [2]) == 3  # the output's 2 is penalised too: 1.9 / 1.2 < 1.8
    processed = s.processed(logits, [2])
    expected = logits.astype(np.float64)
    expected[[1, 2]] /= 1.2
    np.testing.assert_allclose(processed, expected)
    assert logits[1] == np.float32(2.0)  # the device's row is not modified


# ---------------------------------------------------------------- min_tokens
def test_min_tokens_masks_every_end_id_until_reached() -> None:
    logits = np.array([0.0, 1.0, 0.5, 9.0, 8.0])  # EOS (3) then stop id 4 are the best
    s = Sampler(msgspec.structs.replace(GREEDY, min_tokens=2), end_ids=[EOS, 4])
    assert [s.sample(logits, [7] * n) for n in range(4)] == [1, 1, EOS, EOS]
    masked = s.processed(logits, [7])
    assert masked[EOS] == -math.inf and masked[4] == -math.inf and masked[1] == 1.0


def test_random_sampling_never_draws_a_masked_id() -> None:
    logits = np.log(np.array([0.04, 0.01, 0.05, 0.9]))
    params = SamplingParams(temperature=1.0, top_p=0.99, seed=7, min_tokens=1)
    s = Sampler(params, end_ids=[EOS])
    draws = {s.sample(logits) for _ in range(300)}
    assert EOS not in draws and draws == {0, 1, 2}
    assert {s.sample(logits, [0]) for _ in range(50)} >= {EOS}  # reached: EOS is back


# ---------------------------------------------------------------- checks
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"repetition_penalty": math.inf}, "repetition_penalty"),
        ({"repetition_penalty": math.nan}, "repetition_penalty"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 9, "max_tokens": 8}, "min_tokens"),
        ({"stop_token_ids": (5, -1)}, "stop_token_ids"),
        ({"stop_token_ids": (100,)}, "stop_token_ids"),
        ({"top_p": 0.0}, "top_p"),
    ],
)
def test_bad_values_are_rejected_naming_the_field(fields: dict[str, object], param: str) -> None:
    with pytest.raises(EngineRequestError) as info:
        check_params(msgspec.structs.replace(SamplingParams(), **fields), vocab_size=100)
    assert info.value.param == param and info.value.status == 400


def test_good_values_pass() -> None:
    params = SamplingParams(
        max_tokens=8, min_tokens=8, stop_token_ids=(0, 99), repetition_penalty=0.5
    )
    check_params(params, vocab_size=100)


# ---------------------------------------------------------------- stop strings
def vllm_stop_strings(
    text: str, new_chars: int, stops: list[str], include: bool
) -> tuple[str, int] | None:
    """vLLM 0.32's ``check_stop_strings``, transcribed as the oracle: the match completing
    earliest in the text wins (ties: list order); a match must end in the new text."""
    best: tuple[str, int, int] | None = None
    for stop in stops:
        index = text.find(stop, 1 - new_chars - len(stop))
        if index >= 0 and (best is None or index + len(stop) < best[2]):
            best = (stop, index, index + len(stop))
    if best is None:
        return None
    if include:
        return best[0], -1 if best[2] >= len(text) else best[2]
    return best[0], best[1]


def vllm_final_text(
    pieces: list[str], stops: list[str], include: bool, min_tokens: int
) -> tuple[str, bool]:
    """vLLM's detokenizer fed one token's text per step: stop strings are searched only in
    the text of tokens after the first ``min_tokens``; the text is cut at a match."""
    text = ""
    for n, piece in enumerate(pieces, start=1):
        before = len(text)
        text += piece
        if n > min_tokens and len(text) > before:
            hit = vllm_stop_strings(text, len(text) - before, stops, include)
            if hit is not None:
                return (text if hit[1] == -1 else text[: hit[1]]), True
    return text, False


def stream(
    pieces: list[str], stops: list[str], include: bool = False, min_tokens: int = 0
) -> tuple[list[str], bool]:
    f = StopFilter(stops, include=include)
    out = [f.push(p, check=n > min_tokens) for n, p in enumerate(pieces, start=1)]
    if not f.stopped:
        out.append(f.flush())
    return out, f.stopped


def test_include_stop_str_keeps_the_stop_and_holds_nothing_back() -> None:
    out, stopped = stream(["Hello E", "N", "D tail"], ["END"], include=True)
    assert stopped and out == ["Hello E", "N", "D"]


def test_min_tokens_text_is_not_searched_but_a_stop_completing_later_counts() -> None:
    out, stopped = stream(["a.", "b", "c."], ["."], min_tokens=2)
    assert stopped and "".join(out) == "a.bc"
    out, stopped = stream(["xE", "N", "D!"], ["END"], min_tokens=2)
    assert stopped and "".join(out) == "x"  # begins in the held text, completes after


def test_the_stop_completing_first_wins() -> None:
    out, stopped = stream(["abc"], ["abc", "b"])
    assert stopped and out == ["a"]


pieces = st.lists(st.text(alphabet="abE", max_size=3), max_size=12)
stops = st.lists(st.text(alphabet="abE", min_size=1, max_size=3), min_size=1, max_size=3)


@given(pieces, stops, st.booleans(), st.integers(0, 4))
def test_streamed_output_is_vllms_final_text(
    parts: list[str], stop_list: list[str], include: bool, min_tokens: int
) -> None:
    out, stopped = stream(parts, stop_list, include, min_tokens)
    assert ("".join(out), stopped) == vllm_final_text(parts, stop_list, include, min_tokens)


# ---------------------------------------------------------------- the serving layer
EXTENSIONS = {
    "ignore_eos": True,
    "min_tokens": 3,
    "stop_token_ids": [44, 33, 44],
    "repetition_penalty": 1.3,
    "skip_special_tokens": False,
    "include_stop_str_in_output": True,
    "priority": 2,
}
EXPECTED = SamplingParams(
    ignore_eos=True,
    min_tokens=3,
    stop_token_ids=(44, 33),  # de-duplicated, in order, as vLLM
    repetition_penalty=1.3,
    skip_special_tokens=False,
    include_stop_str_in_output=True,
)


def extension_fields(params: SamplingParams) -> tuple[object, ...]:
    names = (
        "ignore_eos",
        "min_tokens",
        "stop_token_ids",
        "repetition_penalty",
        "skip_special_tokens",
        "include_stop_str_in_output",
    )
    return tuple(getattr(params, name) for name in names)


def test_chat_and_completion_requests_carry_the_extensions() -> None:
    engine = cast(EngineProtocol, FakeEngine())
    body = msgspec.json.encode({"model": "m", "prompt": "hi", "max_tokens": 5, **EXTENSIONS})
    ext = vllm_extensions(body)
    done = serving.completion_generation(
        engine, msgspec.json.decode(body, type=CompletionRequest), "r1", ext
    )
    assert extension_fields(done.params) == extension_fields(EXPECTED)
    assert (done.params.max_tokens, done.priority) == (5, 2)
    chat_body = {"model": "m", "messages": user(), "temperature": 0, **EXTENSIONS}
    req = msgspec.convert(chat_body, ChatRequest)
    chat = serving.chat_generation(engine, req, "r2", ext)
    assert extension_fields(chat.params) == extension_fields(EXPECTED)
    assert chat.params.temperature == 0.0


def test_absent_extensions_keep_vllms_defaults() -> None:
    assert vllm_extensions(None) == vllm_extensions(b'{"model": "m"}')
    params = vllm_extensions(None).apply(SamplingParams())
    assert extension_fields(params) == extension_fields(SamplingParams())
    assert params.repetition_penalty == 1.0 and params.skip_special_tokens


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"min_tokens": "3"}', "min_tokens"),
        (b'{"stop_token_ids": [1, "a"]}', "stop_token_ids"),
        (b'{"ignore_eos": 1}', "ignore_eos"),
        (b'{"repetition_penalty": "high"}', "repetition_penalty"),
    ],
)
def test_wrongly_typed_extensions_are_400_naming_the_field(body: bytes, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        vllm_extensions(body)
    assert info.value.param == param


# ---------------------------------------------------------------- the worker over HTTP
@pytest.fixture(scope="module")
def w() -> Iterator[Harness]:
    with worker(FakeEngine(reply="Hello there, friend.")) as harness:
        yield harness


def test_worker_passes_the_extensions_to_the_engine(w: Harness) -> None:
    w.client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=5, extra_body=EXTENSIONS
    )
    w.client.completions.create(model=MODEL, prompt="x", max_tokens=5, extra_body=EXTENSIONS)
    for request in w.engine.requests[-2:]:
        assert extension_fields(request.params) == extension_fields(EXPECTED)
        assert request.priority == 2


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_tokens": 6}, "min_tokens"),  # > max_tokens 5
        ({"min_tokens": -1}, "min_tokens"),
        ({"stop_token_ids": [-4]}, "stop_token_ids"),
        ({"stop_token_ids": ["x"]}, "stop_token_ids"),
    ],
)
def test_worker_rejects_bad_extensions_before_generating(
    w: Harness, extra: dict[str, object], param: str
) -> None:
    before = len(w.engine.requests)
    for create in (
        lambda: w.client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=5, extra_body=extra
        ),
        lambda: w.client.completions.create(
            model=MODEL, prompt="x", max_tokens=5, stream=True, extra_body=extra
        ),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            create()
        body = cast(dict[str, Any], info.value.body)
        assert (body["param"], body["type"]) == (param, "invalid_request_error")
    assert len(w.engine.requests) == before  # nothing ran


# ---------------------------------------------------------------- the in-process provider
def provider_for(engine: FakeEngine) -> JaxProvider:
    async def load(_: JaxProviderConfig, __: object) -> EngineProtocol:
        return cast(EngineProtocol, engine)

    return JaxProvider("local", JaxProviderConfig(), loader=load)


@pytest.mark.anyio
async def test_provider_reads_the_extensions_from_the_clients_body() -> None:
    engine = FakeEngine(reply="ok")
    provider = provider_for(engine)
    await provider.start()
    body = {"model": "fake-model", "messages": user(), "max_tokens": 4, **EXTENSIONS}
    raw = msgspec.json.encode(body)
    ctx = CallContext(request_id="r", upstream_model="fake-model", raw_body=raw, priority=1)
    await provider.chat(msgspec.json.decode(raw, type=ChatRequest), ctx)
    completion = {"model": "fake-model", "prompt": "x", "max_tokens": 4, **EXTENSIONS}
    raw = msgspec.json.encode(completion)
    ctx = msgspec.structs.replace(ctx, raw_body=raw)
    await provider.complete(msgspec.json.decode(raw, type=CompletionRequest), ctx)
    for request in engine.requests:
        assert extension_fields(request.params) == extension_fields(EXPECTED)
        assert request.priority == 1  # the gateway's, not the body's 2


@pytest.mark.anyio
async def test_provider_rejects_bad_extensions_with_param() -> None:
    engine = FakeEngine(reply="ok")
    provider = provider_for(engine)
    await provider.start()
    raw = msgspec.json.encode({"model": "fake-model", "messages": user(), "min_tokens": -2})
    ctx = CallContext(request_id="r", upstream_model="fake-model", raw_body=raw)
    with pytest.raises(InvalidRequestError) as info:
        await provider.chat(msgspec.json.decode(raw, type=ChatRequest), ctx)
    assert info.value.param == "min_tokens"
    assert engine.requests == []
