"""Pure tests of the Responses stream encoder: canonical chunks -> Responses SSE events.

Every event is parsed with the official SDK's SSE decoder, validated against its
``ResponseStreamEvent`` union, and fed to the SDK's own accumulator (the state machine behind
``client.responses.stream()``), whose final response the assertions read."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import omit
from openai._streaming import SSEDecoder
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from core.errors import GatewayError, RateLimitError, UpstreamTimeoutError
from core.wire import ChatChunk, Usage
from gateway.dialects.responses import ResponsesIngress, StreamEncoder, decode_request

EVENTS: pydantic.TypeAdapter[ResponseStreamEvent] = pydantic.TypeAdapter(ResponseStreamEvent)
RESPONSE_ID = "resp_5eed"


def ingress(**body: Any) -> ResponsesIngress:
    body = {"model": "fast", "input": "hi", "stream": True, **body}
    return decode_request(json.dumps(body).encode())


def chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
    choices: bool = True,
) -> ChatChunk:
    body: dict[str, Any] = {"id": "c", "created": 1, "model": "up", "choices": []}
    if choices:
        body["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    if usage is not None:
        body["usage"] = usage
    return msgspec.convert(body, ChatChunk)


def text(piece: str) -> ChatChunk:
    return chunk({"content": piece})


def thought(piece: str) -> ChatChunk:
    return chunk({"reasoning_content": piece})


def call(
    index: int, arguments: str, call_id: str | None = None, name: str | None = None
) -> ChatChunk:
    fn: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        fn["name"] = name
    entry: dict[str, Any] = {"index": index, "function": fn}
    if call_id is not None:
        entry |= {"id": call_id, "type": "function"}
    return chunk({"tool_calls": [entry]})


USAGE = {
    "prompt_tokens": 12,
    "completion_tokens": 30,
    "total_tokens": 42,
    "prompt_tokens_details": {"cached_tokens": 8},
    "completion_tokens_details": {"reasoning_tokens": 20},
}


class Run:
    """One encoded stream: its raw bytes, the parsed events and the SDK's accumulation."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        sse = list(SSEDecoder().iter_bytes(iter([raw])))
        for item in sse:
            assert item.event == json.loads(item.data)["type"]  # `event:` names the data
        # Any: the union has 59 members; each assertion below knows which one it reads
        self.events: list[Any] = [EVENTS.validate_json(item.data) for item in sse]
        self.types = [event.type for event in self.events]
        state: ResponseStreamState[object] = ResponseStreamState(input_tools=omit, text_format=omit)
        for event in self.events:
            state.handle_event(event)
        self.final: Any = state._completed_response  # ParsedResponse | None

    def of(self, kind: str) -> list[Any]:
        return [event for event in self.events if event.type == kind]


def encode(
    chunks: list[ChatChunk],
    finish: str | None = "stop",
    usage: dict[str, Any] | None = None,
    request: ResponsesIngress | None = None,
    fail: GatewayError | None = None,
) -> Run:
    encoder = StreamEncoder(request or ingress(), RESPONSE_ID, 1_700_000_000)
    parts = [encoder.start()]
    parts += [encoder.feed(c) for c in chunks]
    if usage is not None:  # the usage-only chunk that ends an upstream stream
        parts.append(encoder.feed(chunk(usage=usage, choices=False)))
    parts.append(encoder.error(fail) if fail is not None else encoder.finish(None, finish))
    return Run(b"".join(parts))


# ---------------------------------------------------------------- event order
def test_a_text_stream_has_openais_event_sequence() -> None:
    run = encode(
        [chunk({"role": "assistant", "content": ""}), text("Hel"), text("lo")], usage=USAGE
    )
    assert run.types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in run.events] == list(range(len(run.events)))
    created = run.events[0].response
    assert (created.id, created.status, created.output, created.usage) == (
        RESPONSE_ID,
        "in_progress",
        [],
        None,
    )
    delta = run.events[4]
    assert (delta.item_id, delta.output_index, delta.content_index, delta.delta) == (
        "msg_5eed_0",
        0,
        0,
        "Hel",
    )
    assert run.of("response.output_text.done")[0].text == "Hello"
    assert run.final is not None
    assert run.final.output_text == "Hello"
    assert run.final.status == "completed"
    assert run.final.usage is not None
    assert (run.final.usage.input_tokens, run.final.usage.output_tokens) == (12, 30)
    assert run.final.usage.input_tokens_details.cached_tokens == 8
    assert run.final.usage.output_tokens_details.reasoning_tokens == 20


def test_every_event_is_framed_as_event_and_data() -> None:
    run = encode([text("x")])
    frames = run.raw.split(b"\n\n")
    assert frames[-1] == b""
    for frame in frames[:-1]:
        name, data = frame.split(b"\n")
        assert name.startswith(b"event: ") and data.startswith(b"data: ")


def test_reasoning_then_text_then_tool_calls() -> None:
    run = encode(
        [
            thought("Need the "),
            thought("weather."),
            text("Checking."),
            call(0, "", "call_a", "weather"),
            call(0, '{"city":'),
            call(0, '"Oslo"}'),
            call(1, '{"city":"Rome"}', "call_b", "weather"),
        ],
        finish="tool_calls",
        usage=USAGE,
    )
    assert run.types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",  # reasoning
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",  # message
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # function call a
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.output_item.added",  # function call b
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert run.of("response.reasoning_summary_text.done")[0].text == "Need the weather."
    args_done = run.of("response.function_call_arguments.done")
    assert [(e.item_id, e.arguments) for e in args_done] == [
        ("fc_5eed_2", '{"city":"Oslo"}'),
        ("fc_5eed_3", '{"city":"Rome"}'),
    ]
    added = run.of("response.output_item.added")[2].item
    assert (added.type, added.call_id, added.name, added.arguments, added.status) == (
        "function_call",
        "call_a",
        "weather",
        "",
        "in_progress",
    )
    final = run.final
    assert final is not None
    assert [item.type for item in final.output] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
    ]
    reasoning, _, first, second = final.output
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == "Need the weather."
    assert first.type == "function_call" and second.type == "function_call"
    assert (first.call_id, first.arguments, first.status) == (
        "call_a",
        '{"city":"Oslo"}',
        "completed",
    )
    assert (second.call_id, second.arguments) == ("call_b", '{"city":"Rome"}')
    assert final.output_text == "Checking."


def test_stream_and_non_stream_give_the_same_items() -> None:
    from core.wire import ChatResponse
    from gateway.dialects.responses import encode_response

    request = ingress()
    run = encode([thought("t"), text("a"), call(0, "{}", "call_1", "f")], request=request)
    resp = msgspec.convert(
        {
            "id": "c",
            "created": 1,
            "model": "up",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {
                        "role": "assistant",
                        "content": "a",
                        "reasoning_content": "t",
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    },
                }
            ],
        },
        ChatResponse,
    )
    whole = json.loads(encode_response(resp, request, RESPONSE_ID, 1_700_000_000))
    completed = json.loads(run.raw.split(b"\n\n")[-2].split(b"data: ", 1)[1])["response"]
    assert completed["output"] == whole["output"]


def test_refusal_parts_stream_as_refusal_events() -> None:
    run = encode([chunk({"refusal": "I can't "}), chunk({"refusal": "help."})])
    assert run.types[2:-1] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.refusal.delta",
        "response.refusal.delta",
        "response.refusal.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert run.of("response.refusal.done")[0].refusal == "I can't help."
    assert run.final is not None
    message = run.final.output[0]
    assert message.type == "message"
    assert message.content[0].type == "refusal"


def test_text_then_refusal_are_two_parts_of_one_message() -> None:
    run = encode([text("Sure, but "), chunk({"refusal": "no."})])
    indexes = [e.content_index for e in run.of("response.content_part.added")]
    assert indexes == [0, 1]
    assert run.final is not None
    assert [part.type for part in run.final.output[0].content] == ["output_text", "refusal"]


def test_a_call_without_an_id_or_first_name_still_gets_both() -> None:
    run = encode([call(0, '{"a":'), call(0, "1}", name="late")], finish="tool_calls")
    assert run.final is not None
    item = run.final.output[0]
    assert item.type == "function_call"
    assert (item.call_id, item.name, item.arguments) == ("call_5eed_0", "late", '{"a":1}')


def test_length_finish_is_incomplete() -> None:
    run = encode([text("Once upon a")], finish="length")
    assert run.types[-1] == "response.incomplete"
    final = run.events[-1].response
    assert final.status == "incomplete"
    assert final.incomplete_details is not None
    assert final.incomplete_details.reason == "max_output_tokens"
    assert final.output[0].status == "incomplete"
    assert run.final is None  # the SDK's helper only completes on response.completed


def test_finish_reason_and_usage_are_remembered_from_chunks() -> None:
    encoder = StreamEncoder(ingress(), RESPONSE_ID, 1)
    raw = encoder.start() + encoder.feed(text("hi"))
    raw += encoder.feed(chunk({}, finish="length"))
    raw += encoder.feed(chunk(usage=USAGE, choices=False))
    raw += encoder.finish()
    run = Run(raw)
    final = run.events[-1].response
    assert (final.status, final.usage.total_tokens) == ("incomplete", 42)
    assert encoder.finish() == b"" and encoder.error(RateLimitError("late")) == b""


def test_finish_arguments_override_what_the_chunks_said() -> None:
    encoder = StreamEncoder(ingress(), RESPONSE_ID, 1)
    raw = encoder.start() + encoder.feed(chunk({"content": "x"}, finish="stop"))
    raw += encoder.finish(msgspec.convert(USAGE, Usage), "length")
    final = Run(raw).events[-1].response
    assert (final.status, final.usage.input_tokens) == ("incomplete", 12)


def test_an_empty_stream_completes_with_no_output() -> None:
    run = encode([chunk({"role": "assistant"})])
    assert run.types == ["response.created", "response.in_progress", "response.completed"]
    assert run.final is not None and run.final.output == [] and run.final.usage is None


def test_the_final_response_echoes_the_request() -> None:
    request = ingress(instructions="Be brief.", temperature=0.3, metadata={"k": "v"}, store=False)
    run = encode([text("ok")], request=request)
    final = run.events[-1].response
    assert (final.instructions, final.temperature, final.metadata, final.store) == (
        "Be brief.",
        0.3,
        {"k": "v"},
        False,
    )
    assert final.model == "fast"


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (UpstreamTimeoutError("upstream went quiet"), "server_error"),
        (RateLimitError("slow down"), "rate_limit_exceeded"),
    ],
)
def test_an_error_sends_error_then_response_failed(exc: GatewayError, code: str) -> None:
    run = encode([text("partial")], fail=exc)
    assert run.types[-2:] == ["error", "response.failed"]
    error = run.events[-2]
    assert (error.code, error.message) == (exc.code, exc.message)
    failed = run.events[-1].response
    assert failed.status == "failed"
    assert failed.error is not None
    assert (failed.error.code, failed.error.message) == (code, exc.message)
    message = failed.output[0]
    assert message.type == "message" and message.status == "incomplete"
    assert message.content[0].text == "partial"
    assert [e.sequence_number for e in run.events] == list(range(len(run.events)))


# ---------------------------------------------------------------- properties
pieces = st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(pieces)
def test_text_split_anyhow_reassembles(parts: list[str]) -> None:
    run = encode([text(p) for p in parts])
    whole = "".join(parts)
    assert "".join(e.delta for e in run.of("response.output_text.delta")) == whole
    assert run.of("response.output_text.done")[0].text == whole
    assert run.final is not None and run.final.output_text == whole


@settings(max_examples=60, deadline=None)
@given(st.lists(pieces, min_size=1, max_size=4))
def test_tool_call_fragments_reassemble(calls: list[list[str]]) -> None:
    chunks = []
    for index, fragments in enumerate(calls):
        chunks.append(call(index, fragments[0], f"call_{index}", f"tool_{index}"))
        chunks += [call(index, fragment) for fragment in fragments[1:]]
    run = encode(chunks, finish="tool_calls")
    assert run.final is not None
    got = [(item.call_id, item.name, item.arguments) for item in run.final.output]
    assert got == [(f"call_{i}", f"tool_{i}", "".join(f)) for i, f in enumerate(calls)]
    done = [e.arguments for e in run.of("response.function_call_arguments.done")]
    assert done == ["".join(f) for f in calls]


@st.composite
def mixed_chunks(draw: st.DrawFn) -> list[ChatChunk]:
    """Any mix of reasoning, text, refusal and tool-call chunks (calls with fresh indexes
    start with an id and a name, as upstreams send them)."""
    chunks: list[ChatChunk] = []
    calls = 0
    for kind in draw(st.lists(st.sampled_from(["thought", "text", "refusal", "call", "more"]))):
        piece = draw(st.text(max_size=5))
        if kind == "thought":
            chunks.append(thought(piece))
        elif kind == "text":
            chunks.append(text(piece))
        elif kind == "refusal":
            chunks.append(chunk({"refusal": piece}))
        elif kind == "call" or calls == 0:
            chunks.append(call(calls, piece, f"call_{calls}", "f"))
            calls += 1
        else:
            chunks.append(call(calls - 1, piece))
    return chunks


@settings(max_examples=80, deadline=None)
@given(mixed_chunks(), st.sampled_from(["stop", "length", "tool_calls", None]))
def test_any_stream_is_valid_with_increasing_sequence_numbers(
    chunks: list[ChatChunk], finish: str | None
) -> None:
    run = encode(chunks, finish=finish, usage=USAGE)
    assert [e.sequence_number for e in run.events] == list(range(len(run.events)))
    assert run.types[:2] == ["response.created", "response.in_progress"]
    assert run.types[-1] in ("response.completed", "response.incomplete")
    added = [e.output_index for e in run.of("response.output_item.added")]
    done = [e.output_index for e in run.of("response.output_item.done")]
    assert added == list(range(len(added))) and sorted(done) == added
    final = run.events[-1].response
    texts = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert final.output_text == texts
    assert len(final.output) == len(added)
