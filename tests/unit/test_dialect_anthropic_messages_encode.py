"""The Anthropic Messages dialect, response side: canonical answers encoded as Anthropic
messages, SSE streams and errors, checked with the official SDK's own types and parsers
(gateway/dialects/anthropic_messages_encode.py)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx2
import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message as SDKMessage
from anthropic.types import RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import (
    AllTargetsFailedError,
    AuthenticationError,
    ContextLengthError,
    GatewayError,
    InvalidRequestError,
    ModelNotFoundError,
    NoTargetAvailableError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    ServiceUnavailableError,
    UpstreamRateLimitedError,
    UpstreamServerError,
    UpstreamTimeoutError,
)
from core.wire import (
    AssistantMessage,
    ChatChunk,
    ChatResponse,
    Choice,
    ChunkChoice,
    Delta,
    FunctionCall,
    FunctionDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
    make_usage,
)
from gateway.dialects.anthropic_messages import (
    StreamEncoder,
    decode_request,
    encode_response,
    error_body,
    error_status,
    message_id,
)

EVENTS = pydantic.TypeAdapter(RawMessageStreamEvent)


def response(
    message: AssistantMessage, finish: str | None = "stop", usage: Usage | None = None
) -> ChatResponse:
    return ChatResponse("chatcmpl-abc", 1, "upstream-model", [Choice(0, message, finish)], usage)


def encoded(resp: ChatResponse, **kwargs: Any) -> SDKMessage:
    return SDKMessage.model_validate_json(encode_response(resp, "my-alias", **kwargs))


def chunk(delta: Delta, finish: str | None = None, usage: Usage | None = None) -> ChatChunk:
    return ChatChunk("chatcmpl-abc", 1, "up", [ChunkChoice(0, delta, finish)], usage)


def call_delta(
    index: int, *, id: str | None = None, name: str | None = None, args: str | None = None
) -> Delta:
    function = FunctionDelta(name=name, arguments=args)
    return Delta(tool_calls=[ToolCallDelta(index=index, id=id, type="function", function=function)])


def sdk_client(handler: Callable[[httpx2.Request], httpx2.Response]) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="k",
        base_url="http://gateway",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )


ASK: dict[str, Any] = {
    "model": "my-alias",
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "hi"}],
}


# ---------------------------------------------------------------- non-streaming
def test_text_answer() -> None:
    msg = encoded(response(AssistantMessage(content="Hello!"), usage=make_usage(12, 3)))
    assert msg.id == "msg_abc"
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.model == "my-alias"
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == "Hello!"  # type: ignore[union-attr]
    assert msg.stop_reason == "end_turn"
    assert msg.stop_sequence is None
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (12, 3)
    assert msg.usage.cache_read_input_tokens == 0
    assert msg.usage.cache_creation_input_tokens == 0
    assert msg.usage.output_tokens_details is None


def test_thinking_text_and_tools_in_order() -> None:
    calls = [
        ToolCall("call_1", FunctionCall("search", '{"q": "x", "n": [1, 2]}')),
        ToolCall("call_2", FunctionCall("noargs", "")),
    ]
    message = AssistantMessage(content="Looking.", tool_calls=calls, reasoning_content="plan")
    msg = encoded(response(message, "tool_calls"))
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use", "tool_use"]
    thinking, text, first, second = msg.content
    assert thinking.type == "thinking" and thinking.thinking == "plan"
    assert thinking.signature == ""
    assert text.type == "text" and text.text == "Looking."
    assert first.type == "tool_use" and second.type == "tool_use"
    assert (first.id, first.name, first.input) == ("call_1", "search", {"q": "x", "n": [1, 2]})
    assert (second.id, second.name, second.input) == ("call_2", "noargs", {})
    assert msg.stop_reason == "tool_use"


def test_thinking_left_out_when_not_asked() -> None:
    message = AssistantMessage(content="Hi.", reasoning_content="plan")
    msg = encoded(response(message), include_thinking=False)
    assert [b.type for b in msg.content] == ["text"]


@pytest.mark.parametrize("arguments", ["{not json", "[1, 2]", '"text"', "   ", '{"a": 1'])
def test_unusable_tool_arguments_become_an_empty_input(arguments: str) -> None:
    message = AssistantMessage(tool_calls=[ToolCall("call_1", FunctionCall("f", arguments))])
    block = encoded(response(message, "tool_calls")).content[0]
    assert block.type == "tool_use" and block.input == {}


def test_tool_call_without_id_gets_one() -> None:
    message = AssistantMessage(tool_calls=[ToolCall("", FunctionCall("f", "{}"))])
    block = encoded(response(message, "tool_calls")).content[0]
    assert block.type == "tool_use" and block.id.startswith("toolu_") and len(block.id) > 10


@pytest.mark.parametrize(
    ("finish", "tools", "stop_sequence", "expected"),
    [
        ("stop", False, None, "end_turn"),
        (None, False, None, "end_turn"),
        ("something_new", False, None, "end_turn"),
        ("stop", False, "###", "stop_sequence"),
        ("length", False, None, "max_tokens"),
        ("length", True, None, "max_tokens"),
        ("tool_calls", True, None, "tool_use"),
        ("function_call", True, None, "tool_use"),
        ("stop", True, None, "tool_use"),
        ("content_filter", False, None, "refusal"),
    ],
)
def test_stop_reasons(
    finish: str | None, tools: bool, stop_sequence: str | None, expected: str
) -> None:
    calls = [ToolCall("c", FunctionCall("f", "{}"))] if tools else None
    message = AssistantMessage(content="x", tool_calls=calls)
    msg = encoded(response(message, finish), stop_sequence=stop_sequence)
    assert msg.stop_reason == expected
    assert msg.stop_sequence == stop_sequence


def test_usage_excludes_cached_tokens_from_input() -> None:
    # OpenAI: prompt_tokens 1000 includes 600 read from cache and 300 written to it
    usage = make_usage(1000, 50, cached=600, created=300, reasoning=20)
    msg = encoded(response(AssistantMessage(content="x"), usage=usage))
    assert msg.usage.input_tokens == 100
    assert msg.usage.cache_read_input_tokens == 600
    assert msg.usage.cache_creation_input_tokens == 300
    assert msg.usage.output_tokens == 50
    assert msg.usage.output_tokens_details is not None
    assert msg.usage.output_tokens_details.thinking_tokens == 20
    total = msg.usage.input_tokens + 600 + 300
    assert total == usage.prompt_tokens  # Anthropic's documented sum gives OpenAI's count back


def test_no_usage_no_choices() -> None:
    empty = ChatResponse("chatcmpl-1", 1, "m", [])
    msg = encoded(empty)
    assert msg.content == [] and msg.stop_reason == "end_turn"
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (0, 0)


def test_refusal_is_text_and_stops_as_refusal() -> None:
    msg = encoded(response(AssistantMessage(refusal="I can't help with that."), "content_filter"))
    assert msg.content[0].type == "text" and msg.content[0].text == "I can't help with that."
    assert msg.stop_reason == "refusal"


@pytest.mark.parametrize(
    ("seed", "expected"),
    [("chatcmpl-123", "msg_123"), ("msg_01XY", "msg_01XY"), ("req_abc", "msg_req_abc")],
)
def test_message_ids(seed: str, expected: str) -> None:
    assert message_id(seed) == expected


def test_the_sdk_reads_the_answer_and_sends_it_back() -> None:
    calls = [ToolCall("call_7", FunctionCall("weather", '{"city": "Oslo"}'))]
    resp = response(AssistantMessage(content="Checking.", tool_calls=calls), "tool_calls")
    sent: list[bytes] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        assert request.url.path == "/v1/messages"
        sent.append(request.content)
        body = encode_response(resp, "my-alias")
        return httpx2.Response(200, content=body, headers={"content-type": "application/json"})

    client = sdk_client(handler)
    msg = client.messages.create(**ASK)
    assert msg.stop_reason == "tool_use"
    tool = msg.content[1]
    assert tool.type == "tool_use" and tool.input == {"city": "Oslo"}
    # the next turn, as clients build it: the answer as it came, then the tool's result
    result = {"type": "tool_result", "tool_use_id": tool.id, "content": "-3C"}
    follow_up = [*ASK["messages"], msg.to_param(), {"role": "user", "content": [result]}]
    client.messages.create(**{**ASK, "messages": follow_up})
    req = decode_request(sent[1]).request
    assert [m.role for m in req.messages] == ["user", "assistant", "tool"]
    assert req.messages[1].content == "Checking."
    sent_calls = req.messages[1].tool_calls
    assert sent_calls is not None and sent_calls[0].id == "call_7"
    assert json.loads(sent_calls[0].function.arguments) == {"city": "Oslo"}
    assert req.messages[2].tool_call_id == "call_7"


# ---------------------------------------------------------------- streaming
def frames(data: bytes) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each event, checking Anthropic's exact framing: ``event: X\\ndata: {...}\\n\\n``."""
    assert data.endswith(b"\n\n")
    for frame in data[:-2].split(b"\n\n"):
        head, _, tail = frame.partition(b"\n")
        assert head.startswith(b"event: ") and tail.startswith(b"data: ")
        assert b"\n" not in tail
        name = head[len(b"event: ") :].decode()
        payload = json.loads(tail[len(b"data: ") :])
        assert payload["type"] == name
        yield name, payload


def accumulate(data: bytes) -> SDKMessage:
    """The final message as the SDK's stream accumulator builds it, every event validated
    against the SDK's ``RawMessageStreamEvent`` on the way."""
    snapshot = None
    buffers: dict[int, bytes] = {}
    for name, payload in frames(data):
        if name == "ping":
            continue
        event = EVENTS.validate_python(payload)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=buffers)
    assert snapshot is not None
    return SDKMessage.model_validate(snapshot.model_dump())


def run_stream(
    chunks: list[ChatChunk],
    *,
    usage: Usage | None = None,
    finish: str | None = None,
    input_tokens: int = 0,
    include_thinking: bool = True,
) -> bytes:
    encoder = StreamEncoder(
        "my-alias", "msg_1", input_tokens=input_tokens, include_thinking=include_thinking
    )
    out = encoder.start()
    for piece in chunks:
        out += encoder.feed(piece)
    return out + encoder.finish(usage, finish)


def mixed_chunks() -> list[ChatChunk]:
    return [
        chunk(Delta(role="assistant", content="")),
        chunk(Delta(reasoning_content="Let me ")),
        chunk(Delta(reasoning_content="think.")),
        chunk(Delta(content="I'll search ")),
        chunk(Delta(content="twice.")),
        chunk(call_delta(0, id="call_a", name="search", args="")),
        chunk(call_delta(0, args='{"q": ')),
        chunk(call_delta(0, args='"cats"}')),
        chunk(call_delta(1, id="call_b", name="search", args='{"q": "dogs"}')),
        chunk(Delta(), "tool_calls"),
        ChatChunk("chatcmpl-abc", 1, "up", [], make_usage(500, 40, cached=400, reasoning=12)),
    ]


def test_stream_event_sequence() -> None:
    data = run_stream(mixed_chunks(), input_tokens=480)
    events = [(name, payload.get("index")) for name, payload in frames(data)]
    assert events == [
        ("message_start", None),
        ("ping", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("content_block_start", 3),
        ("content_block_delta", 3),
        ("content_block_stop", 3),
        ("message_delta", None),
        ("message_stop", None),
    ]
    payloads = dict(frames(data))
    start = payloads["message_start"]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == 480
    delta = payloads["message_delta"]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 40


def test_stream_accumulates_to_the_full_message() -> None:
    msg = accumulate(run_stream(mixed_chunks(), input_tokens=480))
    assert msg.id == "msg_1" and msg.model == "my-alias"
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use", "tool_use"]
    thinking, text, cats, dogs = msg.content
    assert thinking.type == "thinking" and thinking.thinking == "Let me think."
    assert text.type == "text" and text.text == "I'll search twice."
    assert cats.type == "tool_use" and (cats.id, cats.name, cats.input) == (
        "call_a",
        "search",
        {"q": "cats"},
    )
    assert dogs.type == "tool_use" and dogs.input == {"q": "dogs"}
    assert msg.stop_reason == "tool_use"
    assert msg.usage.input_tokens == 100  # 500 prompt tokens, 400 of them from the cache
    assert msg.usage.cache_read_input_tokens == 400
    assert msg.usage.output_tokens == 40
    assert msg.usage.output_tokens_details is not None
    assert msg.usage.output_tokens_details.thinking_tokens == 12


def test_the_sdk_streams_it() -> None:
    data = run_stream(mixed_chunks())

    def handler(request: httpx2.Request) -> httpx2.Response:
        assert json.loads(request.content)["stream"] is True
        return httpx2.Response(200, content=data, headers={"content-type": "text/event-stream"})

    with sdk_client(handler).messages.stream(**ASK) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == "I'll search twice."
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert final.content[2].input == {"q": "cats"}  # type: ignore[union-attr]


def test_stream_without_thinking_when_not_asked() -> None:
    msg = accumulate(run_stream(mixed_chunks(), include_thinking=False))
    assert [b.type for b in msg.content] == ["text", "tool_use", "tool_use"]


def test_text_after_tools_opens_a_new_block() -> None:
    chunks = [
        chunk(Delta(content="a")),
        chunk(call_delta(0, id="c1", name="f", args="{}")),
        chunk(Delta(content="b")),
    ]
    msg = accumulate(run_stream(chunks, finish="stop"))
    assert [b.type for b in msg.content] == ["text", "tool_use", "text"]
    assert msg.stop_reason == "tool_use"  # a tool was called, whatever the upstream said


def test_empty_answer() -> None:
    data = run_stream([chunk(Delta(role="assistant", content=""))], finish="stop")
    names = [name for name, _ in frames(data)]
    assert names == ["message_start", "ping", "message_delta", "message_stop"]
    assert accumulate(data).content == []


def test_stream_length_and_stop_sequence() -> None:
    assert accumulate(run_stream([chunk(Delta(content="x"), "length")])).stop_reason == "max_tokens"
    encoder = StreamEncoder("m", "msg_2")
    data = encoder.start() + encoder.feed(chunk(Delta(content="x"), "stop"))
    data += encoder.finish(stop_sequence="END")
    msg = accumulate(data)
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", "END")


def test_usage_unknown_keeps_the_input_count_of_message_start() -> None:
    data = run_stream([chunk(Delta(content="x"), "stop")], input_tokens=321)
    delta = dict(frames(data))["message_delta"]
    assert delta["usage"] == {"output_tokens": 0}
    assert accumulate(data).usage.input_tokens == 321


def test_finish_arguments_win_over_the_chunks() -> None:
    chunks = [chunk(Delta(content="x"), "length", make_usage(1, 1))]
    msg = accumulate(run_stream(chunks, usage=make_usage(70, 9), finish="stop"))
    assert msg.stop_reason == "end_turn"
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (70, 9)


def test_tool_call_whose_name_comes_later() -> None:
    chunks = [
        chunk(call_delta(0, id="call_z", args='{"a"')),
        chunk(call_delta(0, name="late", args=": 1}")),
    ]
    msg = accumulate(run_stream(chunks, finish="tool_calls"))
    block = msg.content[0]
    assert block.type == "tool_use" and (block.id, block.name, block.input) == (
        "call_z",
        "late",
        {"a": 1},
    )


def test_tool_call_whose_name_never_comes_still_ends() -> None:
    msg = accumulate(run_stream([chunk(call_delta(0, args="{}"))], finish="tool_calls"))
    block = msg.content[0]
    assert block.type == "tool_use" and block.name == "" and block.id.startswith("toolu_")


def test_interleaved_tool_calls_reach_their_blocks() -> None:
    chunks = [
        chunk(call_delta(0, id="c0", name="f", args='{"x": ')),
        chunk(call_delta(1, id="c1", name="g", args='{"y": ')),
        chunk(call_delta(0, args="1}")),
        chunk(call_delta(1, args="2}")),
    ]
    msg = accumulate(run_stream(chunks, finish="tool_calls"))
    assert [b.input for b in msg.content] == [{"x": 1}, {"y": 2}]  # type: ignore[union-attr]


def test_other_choices_are_ignored() -> None:
    other = ChatChunk("c", 1, "m", [ChunkChoice(1, Delta(content="nope"))])
    msg = accumulate(run_stream([chunk(Delta(content="yes")), other], finish="stop"))
    assert [b.text for b in msg.content] == ["yes"]  # type: ignore[union-attr]


def test_nothing_after_the_end() -> None:
    encoder = StreamEncoder("m", "msg_3")
    encoder.start()
    assert encoder.finish() != b""
    assert encoder.feed(chunk(Delta(content="late"))) == b""
    assert encoder.finish() == b""


def test_error_event() -> None:
    encoder = StreamEncoder("m", "msg_4")
    data = encoder.start() + encoder.feed(chunk(Delta(content="partial")))
    data += encoder.error(UpstreamTimeoutError("upstream x timed out"), "req_1")
    name, payload = list(frames(data))[-1]
    assert name == "error"
    body = ErrorResponse.model_validate(payload)
    assert body.error.type == "timeout_error"
    assert body.error.message == "upstream x timed out"
    assert body.request_id == "req_1"
    assert encoder.feed(chunk(Delta(content="more"))) == b""

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=data, headers={"content-type": "text/event-stream"})

    with (
        pytest.raises(anthropic.APIStatusError) as info,
        sdk_client(handler).messages.stream(**ASK) as stream,
    ):
        stream.get_final_message()
    assert info.value.body["error"]["type"] == "timeout_error"  # type: ignore[index]


# ---------------------------------------------------------------- properties
@settings(max_examples=150, deadline=None)
@given(st.text(min_size=1), st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_any_text_split_into_chunks_reassembles(text: str, cuts: list[int]) -> None:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in itertools.pairwise(points)]
    chunks = [chunk(Delta(content=piece)) for piece in pieces]
    msg = accumulate(run_stream(chunks, finish="stop"))
    assert len(msg.content) == 1
    assert msg.content[0].type == "text" and msg.content[0].text == text


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(st.text(), JSON_VALUES, max_size=4),
    st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_tool_arguments_split_anywhere_reassemble(args: dict[str, Any], cuts: list[int]) -> None:
    text = json.dumps(args, ensure_ascii=False)
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in itertools.pairwise(points)]
    first = chunk(call_delta(0, id="call_p", name="tool", args=""))
    chunks = [first] + [chunk(call_delta(0, args=piece)) for piece in pieces]
    msg = accumulate(run_stream(chunks, finish="tool_calls"))
    block = msg.content[0]
    assert block.type == "tool_use" and block.input == args
    # the non-streaming encoding of the same call agrees
    whole = AssistantMessage(tool_calls=[ToolCall("call_p", FunctionCall("tool", text))])
    assert encoded(response(whole, "tool_calls")).content[0].input == args  # type: ignore[union-attr]


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("exc", "status", "kind"),
    [
        (InvalidRequestError("bad"), 400, "invalid_request_error"),
        (ContextLengthError("too long"), 400, "invalid_request_error"),
        (AuthenticationError("no key"), 401, "authentication_error"),
        (PermissionDeniedError("not yours"), 403, "permission_error"),
        (ModelNotFoundError("no such model"), 404, "not_found_error"),
        (RateLimitError("slow down"), 429, "rate_limit_error"),
        (UpstreamRateLimitedError("upstream busy"), 429, "rate_limit_error"),
        (GatewayError("bug"), 500, "api_error"),
        (UpstreamServerError("upstream 500"), 502, "api_error"),
        (ServiceUnavailableError("draining"), 503, "overloaded_error"),
        (NoTargetAvailableError("all open"), 503, "overloaded_error"),
        (UpstreamTimeoutError("slow"), 504, "timeout_error"),
        (
            AllTargetsFailedError("m", [UpstreamTimeoutError("t", provider="p")]),
            504,
            "timeout_error",
        ),
    ],
)
def test_error_bodies(exc: GatewayError, status: int, kind: str) -> None:
    assert error_status(exc) == status
    body = ErrorResponse.model_validate_json(error_body(exc))
    assert body.type == "error"
    assert body.error.type == kind
    assert body.error.message == exc.message


def test_request_too_large() -> None:
    exc = PayloadTooLargeError("body over 32 MiB")
    assert error_status(exc) == 413
    assert json.loads(error_body(exc)) == {
        "type": "error",
        "error": {"type": "request_too_large", "message": "body over 32 MiB"},
    }


def test_error_message_leads_with_the_param() -> None:
    exc = InvalidRequestError("'max_tokens' must be at most 1000", param="max_tokens")
    body = json.loads(error_body(exc, request_id="req_9"))
    assert body["error"]["message"] == "max_tokens: 'max_tokens' must be at most 1000"
    assert body["request_id"] == "req_9"
    already = InvalidRequestError("messages.0: bad", param="messages.0")
    assert json.loads(error_body(already))["error"]["message"] == "messages.0: bad"


@pytest.mark.parametrize(
    ("exc", "sdk_error"),
    [
        (InvalidRequestError("bad", param="messages"), anthropic.BadRequestError),
        (AuthenticationError("no key"), anthropic.AuthenticationError),
        (PermissionDeniedError("no"), anthropic.PermissionDeniedError),
        (ModelNotFoundError("no model"), anthropic.NotFoundError),
        (RateLimitError("slow"), anthropic.RateLimitError),
        (ServiceUnavailableError("draining"), anthropic.InternalServerError),
        (UpstreamTimeoutError("slow"), anthropic.InternalServerError),
    ],
)
def test_the_sdk_raises_the_matching_error(exc: GatewayError, sdk_error: type[Exception]) -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            error_status(exc), content=error_body(exc), headers={"content-type": "application/json"}
        )

    with pytest.raises(sdk_error) as info:
        sdk_client(handler).messages.create(**ASK)
    error = info.value
    assert isinstance(error, anthropic.APIStatusError)
    assert error.status_code == exc.status
    assert error.body["error"]["message"].endswith(exc.message)  # type: ignore[index]
