"""The Anthropic Messages dialect: response side (canonical answer -> Anthropic's wire).

- ``encode_response``: a ``ChatResponse`` as an Anthropic ``message`` object.
- ``StreamEncoder``: ``ChatChunk``\\s as Anthropic's server-sent events, in its order:
  ``message_start``, ``ping``, per content block ``content_block_start``,
  ``content_block_delta``\\* and ``content_block_stop``, then ``message_delta`` (stop reason,
  usage) and ``message_stop``; or an ``error`` event.
- ``error_body`` / ``error_status``: Anthropic's error shape for a ``GatewayError``.

Mapping decisions:

- Content order: a ``thinking`` block (from ``reasoning_content``, only when the client enabled
  thinking), then ``text`` (``content``, or ``refusal``), then one ``tool_use`` per tool call.
  A thinking block's ``signature`` is ``""``: the SDK requires the field, and no target but
  Anthropic can sign; Anthropic itself would refuse such a block sent back to it.
- ``tool_use.input`` is the arguments JSON parsed; empty, invalid or non-object arguments (a
  call cut off by ``max_tokens``) give ``{}``: clients need an object, and a tool called with
  ``{}`` fails its own schema check, which the model then sees. Streams forward the argument
  text as it comes (``input_json_delta``), as Anthropic does.
- ``stop_reason``: stop -> end_turn (``stop_sequence`` when the caller knows which sequence
  matched: the canonical form does not carry it); length -> max_tokens; tool_calls and
  function_call -> tool_use (also for "stop" with tool calls, as some upstreams say);
  content_filter -> refusal.
- ``usage``: OpenAI's ``prompt_tokens`` includes cached and cache-written tokens, Anthropic's
  ``input_tokens`` excludes both: ``input_tokens = prompt - cached - cache_creation``.
  ``output_tokens_details.thinking_tokens`` carries ``reasoning_tokens`` when known.
- Errors keep the gateway's status; the type follows Anthropic's list by status (400
  invalid_request_error, 401 authentication_error, 402 billing_error, 403 permission_error,
  404 not_found_error, 413 request_too_large, 429 rate_limit_error, 500 api_error, 504
  timeout_error, 529 overloaded_error); other 4xx are invalid_request_error, 503 (no capacity
  now: draining, every target skipped, queue deadline) is overloaded_error, other 5xx
  api_error. 503 stays 503 rather than Anthropic's private 529: proxies and retry logic
  understand it, and the SDK retries both.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import msgspec
from msgspec import Struct

from core.errors import GatewayError
from core.wire import AssistantMessage, ChatChunk, ChatResponse, Delta, ToolCallDelta, Usage

JSONObject = dict[str, Any]


# ---------------------------------------------------------------- message and blocks
class TextOut(Struct, tag="text", tag_field="type"):
    text: str


class ThinkingOut(Struct, tag="thinking", tag_field="type"):
    thinking: str
    signature: str = ""


class ToolUseOut(Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: JSONObject


BlockOut = TextOut | ThinkingOut | ToolUseOut


class ThinkingTokens(Struct):
    thinking_tokens: int


class UsageOut(Struct, omit_defaults=True):
    """Message usage; the counts are always sent (required fields are never omitted)."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    output_tokens_details: ThinkingTokens | None = None


class MessageOut(Struct, tag="message", tag_field="type"):
    """Fields in Anthropic's order (the tag, ``type``, is always encoded first)."""

    id: str
    role: Literal["assistant"]
    model: str
    content: list[BlockOut]
    stop_reason: str | None
    stop_sequence: str | None
    usage: UsageOut


# ---------------------------------------------------------------- stream events
class MessageStartEvent(Struct, tag="message_start", tag_field="type"):
    message: MessageOut


class PingEvent(Struct, tag="ping", tag_field="type"):
    pass


class BlockStartEvent(Struct, tag="content_block_start", tag_field="type"):
    index: int
    content_block: BlockOut


class TextDelta(Struct, tag="text_delta", tag_field="type"):
    text: str


class ThinkingDelta(Struct, tag="thinking_delta", tag_field="type"):
    thinking: str


class InputJSONDelta(Struct, tag="input_json_delta", tag_field="type"):
    partial_json: str


class BlockDeltaEvent(Struct, tag="content_block_delta", tag_field="type"):
    index: int
    delta: TextDelta | ThinkingDelta | InputJSONDelta


class BlockStopEvent(Struct, tag="content_block_stop", tag_field="type"):
    index: int


class MessageDeltaBody(Struct):
    stop_reason: str | None
    stop_sequence: str | None


class DeltaUsageOut(Struct, omit_defaults=True):
    """``message_delta`` usage: cumulative counts; one left out keeps its earlier value."""

    output_tokens: int
    input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    output_tokens_details: ThinkingTokens | None = None


class MessageDeltaEvent(Struct, tag="message_delta", tag_field="type"):
    delta: MessageDeltaBody
    usage: DeltaUsageOut


class MessageStopEvent(Struct, tag="message_stop", tag_field="type"):
    pass


class ErrorInfo(Struct):
    type: str
    message: str


class ErrorOut(Struct, tag="error", tag_field="type", omit_defaults=True):
    error: ErrorInfo
    request_id: str | None = None


Event = (
    MessageStartEvent
    | PingEvent
    | BlockStartEvent
    | BlockDeltaEvent
    | BlockStopEvent
    | MessageDeltaEvent
    | MessageStopEvent
    | ErrorOut
)

_encoder = msgspec.json.Encoder()


def sse(event: Event) -> bytes:
    """``event: <type>\\ndata: <json>\\n\\n``, as Anthropic frames every event."""
    name = str(event.__struct_config__.tag)
    return b"event: " + name.encode() + b"\ndata: " + _encoder.encode(event) + b"\n\n"


# ---------------------------------------------------------------- shared mappings
def message_id(seed: str) -> str:
    """An Anthropic message id (``msg_...``) for an upstream or gateway id."""
    if seed.startswith("msg_"):
        return seed
    return "msg_" + seed.removeprefix("chatcmpl-")


def _tool_use_id(call_id: str | None) -> str:
    """The call's id, or a fresh ``toolu_`` one for upstreams that send none."""
    return call_id or "toolu_" + os.urandom(12).hex()


_STOP = {
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def stop_reason(finish_reason: str | None, has_tool_use: bool, stop_sequence: str | None) -> str:
    """Anthropic's ``stop_reason`` for OpenAI's ``finish_reason`` (see the module doc)."""
    if stop_sequence is not None:
        return "stop_sequence"
    mapped = _STOP.get(finish_reason or "")
    if mapped is not None:
        return mapped
    return "tool_use" if has_tool_use else "end_turn"


def usage_out(usage: Usage | None) -> UsageOut:
    """Anthropic usage for canonical usage (zeros when the upstream reported none)."""
    if usage is None:
        return UsageOut(0, 0, 0, 0)
    details = usage.prompt_tokens_details
    read = details.cached_tokens if details else 0
    written = (details.cache_creation_tokens or 0) if details else 0
    reasoning = usage.reasoning_tokens
    return UsageOut(
        input_tokens=max(usage.prompt_tokens - read - written, 0),
        output_tokens=usage.completion_tokens,
        cache_creation_input_tokens=written,
        cache_read_input_tokens=read,
        output_tokens_details=ThinkingTokens(reasoning) if reasoning else None,
    )


def delta_usage(usage: Usage | None) -> DeltaUsageOut:
    """The final ``message_delta`` usage; without upstream usage only ``output_tokens`` (0)
    is sent, so the input count ``message_start`` gave is kept by clients."""
    if usage is None:
        return DeltaUsageOut(0)
    full = usage_out(usage)
    return DeltaUsageOut(
        output_tokens=full.output_tokens,
        input_tokens=full.input_tokens,
        cache_creation_input_tokens=full.cache_creation_input_tokens,
        cache_read_input_tokens=full.cache_read_input_tokens,
        output_tokens_details=full.output_tokens_details,
    )


_object_decoder = msgspec.json.Decoder(JSONObject)


def tool_input(arguments: str) -> JSONObject:
    """A tool call's arguments as ``input``: ``{}`` unless they are a JSON object."""
    if not arguments.strip():
        return {}
    try:
        return _object_decoder.decode(arguments)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {}


# ---------------------------------------------------------------- non-streaming
def encode_response(
    resp: ChatResponse,
    requested_model: str,
    *,
    include_thinking: bool = True,
    stop_sequence: str | None = None,
) -> bytes:
    """The Anthropic ``message`` JSON for ``resp`` (its first choice), naming the model as
    the client asked for it. Pass ``include_thinking=ingress.wants_thinking``, and the
    matched stop sequence when known."""
    blocks: list[BlockOut] = []
    finish: str | None = None
    if resp.choices:
        choice = resp.choices[0]
        blocks = content_blocks(choice.message, include_thinking)
        finish = choice.finish_reason
    has_tool_use = any(isinstance(block, ToolUseOut) for block in blocks)
    message = MessageOut(
        id=message_id(resp.id),
        role="assistant",
        model=requested_model,
        content=blocks,
        stop_reason=stop_reason(finish, has_tool_use, stop_sequence),
        stop_sequence=stop_sequence,
        usage=usage_out(resp.usage),
    )
    return _encoder.encode(message)


def content_blocks(message: AssistantMessage, include_thinking: bool) -> list[BlockOut]:
    """Thinking, then text, then tool calls; empty parts make no block."""
    blocks: list[BlockOut] = []
    if include_thinking and message.reasoning_content:
        blocks.append(ThinkingOut(message.reasoning_content))
    text = message.content or message.refusal
    if text:
        blocks.append(TextOut(text))
    for call in message.tool_calls or ():
        name, arguments = call.function.name, call.function.arguments
        blocks.append(ToolUseOut(_tool_use_id(call.id), name, tool_input(arguments)))
    return blocks


# ---------------------------------------------------------------- errors
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status."""
    known = _ERROR_TYPES.get(status)
    if known is not None:
        return known
    return "invalid_request_error" if status < 500 else "api_error"


def error_status(exc: GatewayError) -> int:
    """The HTTP status of the error response: the gateway's own (see the module doc)."""
    return exc.status


def error_message(exc: GatewayError) -> str:
    """The message, led by the offending field when the error names one and the message
    does not already (Anthropic writes ``messages.0.content: ...``)."""
    if exc.param and not exc.message.startswith(exc.param):
        return f"{exc.param}: {exc.message}"
    return exc.message


def _error(exc: GatewayError, request_id: str | None) -> ErrorOut:
    return ErrorOut(ErrorInfo(error_type(exc.status), error_message(exc)), request_id)


def error_body(exc: GatewayError, request_id: str | None = None) -> bytes:
    """``{"type": "error", "error": {"type": ..., "message": ...}, "request_id": ...}``."""
    return _encoder.encode(_error(exc, request_id))


# ---------------------------------------------------------------- streaming
BlockKind = Literal["text", "thinking"] | int
"""The open block: text, thinking, or the tool_use of this OpenAI tool-call index."""


class _PendingCall:
    """A tool call seen without its name yet: its block cannot start before the name."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.arguments: list[str] = []


class StreamEncoder:
    """Canonical chunks in, Anthropic SSE bytes out, for one answer.

    Call ``start`` once, ``feed`` per chunk, then ``finish`` (or ``error``); each returns
    the bytes to write (possibly empty). Blocks are numbered in the order they open; a block
    closes when another kind starts. Only choice 0 is read (this ingress never asks for n >
    1). Upstreams that interleave parallel tool calls get their later argument pieces sent to
    the block they belong to, after its ``content_block_stop``: the SDK accumulates by index,
    and dropping them would corrupt the input.
    """

    def __init__(
        self,
        model: str,
        message_id: str,
        *,
        input_tokens: int = 0,
        include_thinking: bool = True,
    ) -> None:
        self.model = model
        self.message_id = message_id
        self.input_tokens = input_tokens
        self.include_thinking = include_thinking
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.done = False
        self._open: BlockKind | None = None
        self._index = -1  # the index of the latest block
        self._blocks: dict[int, int] = {}  # tool-call index -> block index
        self._pending: dict[int, _PendingCall] = {}

    def start(self) -> bytes:
        """``message_start`` (empty content, the input tokens known so far) and a ``ping``."""
        usage = UsageOut(self.input_tokens, 0, 0, 0)
        message = MessageOut(self.message_id, "assistant", self.model, [], None, None, usage)
        return sse(MessageStartEvent(message)) + sse(PingEvent())

    def feed(self, chunk: ChatChunk) -> bytes:
        """The events for one chunk; remembers its finish reason and usage for ``finish``."""
        if self.done:
            return b""
        if chunk.usage is not None:
            self.usage = chunk.usage
        out: list[bytes] = []
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            self._delta(choice.delta, out)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
        return b"".join(out)

    def finish(
        self,
        usage: Usage | None = None,
        finish_reason: str | None = None,
        *,
        stop_sequence: str | None = None,
    ) -> bytes:
        """Close the open block, then ``message_delta`` (stop reason, cumulative usage) and
        ``message_stop``. Arguments override what the chunks said."""
        if self.done:
            return b""
        out: list[bytes] = []
        for index in list(self._pending):  # a call whose name never came still ends a block
            self._start_call(index, "", out)
        self._close(out)
        self.done = True
        reason = stop_reason(finish_reason or self.finish_reason, bool(self._blocks), stop_sequence)
        body = MessageDeltaBody(reason, stop_sequence)
        out.append(sse(MessageDeltaEvent(body, delta_usage(usage or self.usage))))
        out.append(sse(MessageStopEvent()))
        return b"".join(out)

    def error(self, exc: GatewayError, request_id: str | None = None) -> bytes:
        """The ``error`` event that ends a stream which failed after it started."""
        self.done = True
        return sse(_error(exc, request_id))

    # ------------------------------------------------------------ blocks
    def _delta(self, delta: Delta, out: list[bytes]) -> None:
        if delta.reasoning_content and self.include_thinking:
            self._open_kind("thinking", out)
            out.append(sse(BlockDeltaEvent(self._index, ThinkingDelta(delta.reasoning_content))))
        text = delta.content or delta.refusal
        if text:
            self._open_kind("text", out)
            out.append(sse(BlockDeltaEvent(self._index, TextDelta(text))))
        for call in delta.tool_calls or ():
            self._tool_delta(call, out)

    def _open_kind(self, kind: Literal["text", "thinking"], out: list[bytes]) -> None:
        if self._open == kind:
            return
        self._close(out)
        self._begin(TextOut("") if kind == "text" else ThinkingOut(""), out)
        self._open = kind

    def _tool_delta(self, call: ToolCallDelta, out: list[bytes]) -> None:
        function = call.function
        arguments = function.arguments if function else None
        block = self._blocks.get(call.index)
        if block is not None:
            if arguments:
                out.append(sse(BlockDeltaEvent(block, InputJSONDelta(arguments))))
            return
        pending = self._pending.setdefault(call.index, _PendingCall())
        pending.id = call.id or pending.id
        if arguments:
            pending.arguments.append(arguments)
        if function is not None and function.name:
            self._start_call(call.index, function.name, out)

    def _start_call(self, index: int, name: str, out: list[bytes]) -> None:
        pending = self._pending.pop(index)
        self._close(out)
        self._begin(ToolUseOut(_tool_use_id(pending.id), name, {}), out)
        self._open = index
        self._blocks[index] = self._index
        if pending.arguments:
            piece = InputJSONDelta("".join(pending.arguments))
            out.append(sse(BlockDeltaEvent(self._index, piece)))

    def _begin(self, block: BlockOut, out: list[bytes]) -> None:
        self._index += 1
        out.append(sse(BlockStartEvent(self._index, block)))

    def _close(self, out: list[bytes]) -> None:
        if self._open is not None:
            out.append(sse(BlockStopEvent(self._index)))
            self._open = None
