"""The Anthropic Messages dialect: the shapes Anthropic answers with.

The ``message`` object and its content blocks, the stream's events and the error object, as
msgspec Structs whose tag is the ``type`` Anthropic writes first; ``sse`` frames one event
as Anthropic does. ``anthropic_messages_encode`` and ``anthropic_messages_stream`` fill them.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct

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
