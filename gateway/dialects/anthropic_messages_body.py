"""The Anthropic Messages dialect: what clients send to ``POST /v1/messages``.

The msgspec shapes the decoder reads a body into (``MessagesBody`` and its parts), lenient
where the translation (``anthropic_messages_to_chat``) checks the details itself, so that a
malformed or unsupported block is a 400 naming it. Fields the translation does not use are
not declared: they stay in the raw body, which Anthropic targets get.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from core.wire import Count, ModelName, UnitFloat

JSONObject = dict[str, Any]


class Source(Struct):
    """An image or document source: ``base64`` (media_type, data), ``url``, ``text``..."""

    type: str
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class Block(Struct):
    """Any content block. One lenient shape for every ``type``, checked by the translation,
    so an unsupported or malformed block is a 400 naming it, not a generic schema error.
    Fields of kinds the translation drops (``thinking``, ``signature``, ``cache_control``,
    ``citations``) are not declared: msgspec skips them without building anything."""

    type: str
    text: str | None = None
    source: Source | None = None
    id: str | None = None
    name: str | None = None
    input: JSONObject | None = None
    tool_use_id: str | None = None
    content: str | list[Block] | None = None
    is_error: bool | None = None
    title: str | None = None


class InMessage(Struct):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class SystemBlock(Struct):
    type: str
    text: str


class InTool(Struct):
    name: str
    type: str | None = None
    description: str | None = None
    input_schema: JSONObject | None = None


class InToolChoice(Struct):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class InThinking(Struct):
    type: str  # enabled | disabled | adaptive | between_tools; newer kinds mean "model default"
    budget_tokens: Annotated[int, Meta(ge=1)] | None = None


class InMetadata(Struct):
    user_id: str | None = None


class InOutputFormat(Struct):
    type: str
    schema: JSONObject | None = None


class InOutputConfig(Struct):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: InOutputFormat | None = None


class MessagesBody(Struct):
    """The fields of ``POST /v1/messages`` the translation uses; others are ignored (they
    stay in the raw body). Bounds follow Anthropic's (temperature 0..1)."""

    model: ModelName
    max_tokens: Count
    messages: list[InMessage]
    system: str | list[SystemBlock] | None = None
    tools: list[InTool] | None = None
    tool_choice: InToolChoice | None = None
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_p: UnitFloat | None = None
    top_k: Count | None = None
    stream: bool = False
    metadata: InMetadata | None = None
    thinking: InThinking | None = None
    output_config: InOutputConfig | None = None
    service_tier: str | None = None
