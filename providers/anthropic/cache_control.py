"""Anthropic prompt-cache breakpoints (``"cache_control": {"type": "ephemeral"}``).

Anthropic caches the request prefix up to each block that carries ``cache_control``, in the
order tools -> system -> messages, and accepts at most 4 such breakpoints per request.
Two sources, never mixed:

- The client's own marks. OpenAI-format clients put ``cache_control`` on content parts (or
  on a whole message, or on a tool); ``ChatRequest`` does not keep those fields, so they are
  read from the raw body. A marked message's breakpoint goes on the last block the message
  converted to (a mark on an earlier part of the same message moves to its end); a marked
  tool keeps its mark; the client's ``cache_control`` object (a ``ttl`` too) is forwarded.
  If the client marked more than 4 places, the last 4 are kept: they cover the longest
  prefixes, and Anthropic looks back from each breakpoint for earlier cache entries.
- Automatic marks, only when the client placed none and ``min_chars`` is set: the last tool
  when the tool definitions (as JSON) are at least ``min_chars`` long; the last system text
  block when the system prompt is at least ``min_chars`` long, or when no tool was marked
  and tools + system together reach ``min_chars`` (the cached prefix is cumulative, so that
  is the first point where caching pays). A breakpoint on a short system prompt after
  already-marked tools would only add a cache write, so it is not placed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from core.wire import ChatRequest
from providers.anthropic import wire
from providers.anthropic.convert import BlockLocation, build_located

MAX_BREAKPOINTS = 4
EPHEMERAL: dict[str, Any] = {"type": "ephemeral"}

Marks = dict[int, dict[str, Any]]  # client position -> the client's cache_control object
_body_decoder = msgspec.json.Decoder(dict[str, Any])


class ClientMarks(msgspec.Struct, frozen=True):
    """Where the client asked for breakpoints: message positions and tool positions."""

    messages: Marks
    tools: Marks


def client_marks(raw_body: bytes | None) -> ClientMarks | None:
    """The client's ``cache_control`` marks in its OpenAI-format body, or None if it has
    none (or the body is absent or not a JSON object)."""
    if not raw_body or b"cache_control" not in raw_body:
        return None  # the common case costs one substring scan, no second decode
    try:
        body = _body_decoder.decode(raw_body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    messages = _marked(body.get("messages"), _message_mark)
    tools = _marked(body.get("tools"), _tool_mark)
    return ClientMarks(messages, tools) if messages or tools else None


def _marked(items: Any, mark_of: Callable[[dict[str, Any]], dict[str, Any] | None]) -> Marks:
    if not isinstance(items, list):
        return {}
    marks = {i: mark_of(item) for i, item in enumerate(items) if isinstance(item, dict)}
    return {i: mark for i, mark in marks.items() if mark is not None}


def _control(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    return value if isinstance(value, dict) and "type" in value else dict(EPHEMERAL)


def _message_mark(message: dict[str, Any]) -> dict[str, Any] | None:
    mark = _control(message.get("cache_control"))
    content = message.get("content")
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                mark = _control(part.get("cache_control")) or mark
    return mark


def _tool_mark(tool: dict[str, Any]) -> dict[str, Any] | None:
    function = tool.get("function")
    inner = function.get("cache_control") if isinstance(function, dict) else None
    return _control(tool.get("cache_control")) or _control(inner)


def encode_request(
    req: ChatRequest,
    model: str,
    default_max_tokens: int,
    *,
    stream: bool,
    raw_body: bytes | None = None,
    min_chars: int | None = None,
) -> bytes:
    """The Anthropic JSON body for ``req`` with cache breakpoints placed (see the module
    docstring); byte-identical to encoding ``convert.build_request`` when none apply."""
    body, ends = build_located(req, model, default_max_tokens, stream=stream)
    marks = client_marks(raw_body)
    if marks is None and min_chars is None:
        return wire.encoder.encode(body)
    payload: dict[str, Any] = msgspec.to_builtins(body)
    if marks is not None:
        targets = _client_targets(payload, marks, ends, bool(req.tools))
    else:
        targets = _auto_targets(payload, min_chars or 0)
    for block, control in targets[-MAX_BREAKPOINTS:]:
        block["cache_control"] = control
    return wire.encoder.encode(payload)


Placement = list[tuple[dict[str, Any], dict[str, Any]]]  # (block, cache_control), in order


def _system_blocks(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The system field as a list of text blocks (a plain string is converted in place,
    since only blocks can carry ``cache_control``)."""
    system = payload.get("system")
    if isinstance(system, str):
        payload["system"] = [{"type": "text", "text": system}]
    blocks: list[dict[str, Any]] = payload.get("system") or []
    return blocks


def _client_targets(
    payload: dict[str, Any], marks: ClientMarks, ends: dict[int, BlockLocation], tools: bool
) -> Placement:
    placed: Placement = []
    if tools:  # client tools convert one to one, in order
        for index, block in enumerate(payload.get("tools") or []):
            if index in marks.tools:
                placed.append((block, marks.tools[index]))
    system, turns = [], []
    for position in sorted(marks.messages):
        where = ends.get(position)
        if where is None:
            continue  # the message converted to nothing
        control = marks.messages[position]
        if where[0] < 0:
            system.append((_system_blocks(payload)[where[1]], control))
        else:
            turns.append((payload["messages"][where[0]]["content"][where[1]], control))
    return placed + system + turns


def _auto_targets(payload: dict[str, Any], min_chars: int) -> Placement:
    placed: Placement = []
    tools: list[dict[str, Any]] = payload.get("tools") or []
    tools_chars = len(wire.encoder.encode(tools)) if tools else 0
    if tools and tools_chars >= min_chars:
        placed.append((tools[-1], dict(EPHEMERAL)))
    system = payload.get("system")
    if system:
        texts = [system] if isinstance(system, str) else [block["text"] for block in system]
        system_chars = sum(len(text) for text in texts)
        if system_chars >= min_chars or (not placed and tools_chars + system_chars >= min_chars):
            placed.append((_system_blocks(payload)[-1], dict(EPHEMERAL)))
    return placed
