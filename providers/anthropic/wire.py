"""Anthropic Messages API wire types (``POST /v1/messages``, version 2023-06-01).

Request types are encoded (``omit_defaults`` keeps absent options off the wire); response and
stream types are decoded leniently: block and delta ``type`` is a plain string so block kinds
this adapter does not convert (``redacted_thinking``, ``server_tool_use`` ...) decode and are
skipped instead of failing the whole answer.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct

JSONObject = dict[str, Any]


# ---------------------------------------------------------------- request
class TextBlock(Struct, tag="text", tag_field="type"):
    text: str


class Base64Source(Struct, tag="base64", tag_field="type"):
    media_type: str
    data: str


class URLSource(Struct, tag="url", tag_field="type"):
    url: str


class ImageBlock(Struct, tag="image", tag_field="type"):
    source: Base64Source | URLSource


class ToolUseBlock(Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: JSONObject


class ToolResultBlock(Struct, tag="tool_result", tag_field="type", omit_defaults=True):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] | None = None


RequestBlock = TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock


class RequestMessage(Struct):
    role: Literal["user", "assistant"]
    content: list[RequestBlock]


class ToolParam(Struct, omit_defaults=True):
    name: str
    input_schema: JSONObject
    description: str | None = None


class ToolChoiceParam(Struct, omit_defaults=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Metadata(Struct):
    user_id: str


class ThinkingParam(Struct, tag="enabled", tag_field="type"):
    """Extended thinking: ``budget_tokens`` >= 1024 and below ``max_tokens``."""

    budget_tokens: int


class MessagesRequest(Struct, omit_defaults=True):
    """The body of ``POST /v1/messages``."""

    model: str
    messages: list[RequestMessage]
    max_tokens: int
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None
    stream: bool = False


# ---------------------------------------------------------------- response
class ResponseBlock(Struct):
    """One content block of an answer: ``text`` carries ``text``; ``thinking`` carries
    ``thinking`` (its ``signature`` is not kept); ``tool_use`` carries ``id``, ``name`` and
    ``input``; other kinds are decoded and ignored."""

    type: str
    text: str | None = None
    thinking: str | None = None
    id: str | None = None
    name: str | None = None
    input: JSONObject | None = None


class ResponseUsage(Struct):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class MessagesResponse(Struct):
    id: str
    model: str
    content: list[ResponseBlock]
    usage: ResponseUsage
    stop_reason: str | None = None
    stop_sequence: str | None = None
    role: str = "assistant"
    type: str = "message"


# ---------------------------------------------------------------- stream events
class MessageStart(Struct):
    message: MessagesResponse


class ContentBlockStart(Struct):
    index: int
    content_block: ResponseBlock


class BlockDelta(Struct):
    """``text_delta`` carries ``text``; ``input_json_delta`` carries ``partial_json``;
    ``thinking_delta`` carries ``thinking`` (``signature_delta`` is decoded and ignored)."""

    type: str
    text: str | None = None
    partial_json: str | None = None
    thinking: str | None = None


class ContentBlockDelta(Struct):
    index: int
    delta: BlockDelta


class ContentBlockStop(Struct):
    index: int


class MessageDeltaBody(Struct):
    stop_reason: str | None = None
    stop_sequence: str | None = None


class DeltaUsage(Struct):
    """``message_delta`` usage: counts are cumulative; absent ones keep earlier values."""

    output_tokens: int | None = None
    input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class MessageDelta(Struct):
    delta: MessageDeltaBody
    usage: DeltaUsage | None = None


class ErrorInfo(Struct):
    type: str
    message: str


class ErrorBody(Struct):
    """An error answer (any non-2xx status) and the ``error`` stream event share this shape."""

    error: ErrorInfo
    type: str = "error"
    request_id: str | None = None


encoder = msgspec.json.Encoder()
response_decoder = msgspec.json.Decoder(MessagesResponse)
error_decoder = msgspec.json.Decoder(ErrorBody)
message_start_decoder = msgspec.json.Decoder(MessageStart)
block_start_decoder = msgspec.json.Decoder(ContentBlockStart)
block_delta_decoder = msgspec.json.Decoder(ContentBlockDelta)
block_stop_decoder = msgspec.json.Decoder(ContentBlockStop)
message_delta_decoder = msgspec.json.Decoder(MessageDelta)
