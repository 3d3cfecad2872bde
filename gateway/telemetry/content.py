"""Captured prompts and completions as the GenAI semantic conventions' message JSON,
redacted and cut (only with ``observability.tracing.capture_content``)."""

from __future__ import annotations

from typing import Any

import msgspec

from core.wire import Message, TextPart
from gateway.process.redact import Redactor
from gateway.telemetry.record import CAPTURE_MAX_CHARS

_TRUNCATED = "…[truncated]"
_MESSAGES = msgspec.json.Decoder(list[Message])
Attributes = dict[str, Any]


class Cut:
    """Redacts text and cuts what one attribute holds at ``CAPTURE_MAX_CHARS``."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self.left = CAPTURE_MAX_CHARS

    def text(self, value: object) -> str:
        text = value if isinstance(value, str) else "" if value is None else str(value)
        if len(text) > self.left:
            text = text[: self.left] + _TRUNCATED
        self.left = max(0, self.left - len(text))
        return self.redactor.redact(text)


def input_messages(content_in: str, cut: Cut) -> list[Attributes]:
    """OpenAI-shaped messages (JSON) as the semantic conventions' input messages: role
    and parts (text, tool calls, tool results; other parts by their type only, never
    their data). Text that is not such JSON is one user message."""
    try:
        messages = _MESSAGES.decode(content_in)
    except msgspec.DecodeError:
        return [{"role": "user", "parts": [{"type": "text", "content": cut.text(content_in)}]}]
    return [{"role": m.role, "parts": _parts(m, cut)} for m in messages]


def _parts(message: Message, cut: Cut) -> list[Attributes]:
    content = message.content
    if message.role == "tool":
        text = content if isinstance(content, str) else to_json(content)
        return [
            {"type": "tool_call_response", "id": message.tool_call_id, "response": cut.text(text)}
        ]
    parts: list[Attributes] = [
        {"type": "text", "content": cut.text(part.text)}
        if isinstance(part, TextPart)
        else {"type": part.__struct_config__.tag}
        for part in ([TextPart(content)] if isinstance(content, str) else content or ())
    ]
    parts += [
        {
            "type": "tool_call",
            "id": call.id,
            "name": call.function.name,
            "arguments": cut.text(call.function.arguments),
        }
        for call in message.tool_calls or ()
    ]
    return parts


def to_json(value: object) -> str:
    return msgspec.json.encode(value).decode()
