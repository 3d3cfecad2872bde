"""The Anthropic Messages dialect (``POST /v1/messages``): request side.

``decode_request`` parses what Anthropic clients send (the ``anthropic`` SDK, Claude Code) and
translates it to the canonical ``ChatRequest`` (OpenAI Chat Completions shape), keeping the raw
body for targets that speak Anthropic themselves. Pure: no I/O, no clock, no ``json``.

The dialect's modules, by job (the names a route needs are re-exported here, so it imports
one module):

- ``anthropic_messages_body``: the shapes of what clients send (``MessagesBody``).
- ``anthropic_messages_to_chat``: a body as the canonical request (``to_chat_request``; the
  mapping, field by field, is in its doc).
- ``anthropic_messages_wire``: the shapes Anthropic answers with (message, events, error).
- ``anthropic_messages_encode``: a canonical answer as a ``message`` (``encode_response``),
  and errors in Anthropic's shape (``error_body``, ``error_status``).
- ``anthropic_messages_stream``: canonical chunks as Anthropic's events (``StreamEncoder``).

Bad input raises ``InvalidRequestError`` whose ``param`` is the JSON path in Anthropic's style
(``messages.0.content.1.source``) and whose message starts with it.
"""

from __future__ import annotations

import re

import msgspec
from msgspec import Struct

from core.errors import InvalidRequestError
from core.wire import ChatRequest
from gateway.dialects.anthropic_messages_body import MessagesBody
from gateway.dialects.anthropic_messages_encode import (
    encode_response,
    error_body,
    error_status,
    message_id,
)
from gateway.dialects.anthropic_messages_stream import StreamEncoder
from gateway.dialects.anthropic_messages_to_chat import (
    invalid_at,
    reasoning_effort,
    to_chat_request,
)

__all__ = [
    "MessagesIngress",
    "StreamEncoder",
    "decode_request",
    "encode_response",
    "error_body",
    "error_status",
    "message_id",
    "reasoning_effort",
    "to_chat_request",
]

_DECODER = msgspec.json.Decoder(MessagesBody)


class MessagesIngress(Struct):
    """One decoded Messages request: the canonical request to route and execute, the raw
    body (passed through to Anthropic targets), and what the answer's encoding needs."""

    request: ChatRequest
    raw: bytes
    stream: bool
    wants_thinking: bool
    """The client enabled thinking (enabled or adaptive): only then may the answer carry
    thinking blocks (a client that did not ask often reads ``content[0].text``)."""
    service_tier: str | None = None


# ---------------------------------------------------------------- decoding
def decode_request(raw: bytes) -> MessagesIngress:
    """Parse and translate a Messages request body; ``InvalidRequestError`` (400) with
    ``param`` for anything malformed or not translatable. The caller bounds the body's size
    and JSON depth first, as for every route."""
    body = _decode(raw)
    thinking = body.thinking
    return MessagesIngress(
        request=to_chat_request(body),
        raw=raw,
        stream=body.stream,
        wants_thinking=thinking is not None and thinking.type != "disabled",
        service_tier=body.service_tier,
    )


def _decode(raw: bytes) -> MessagesBody:
    try:
        return _DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        raise _schema_error(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequestError(f"The request body is not valid JSON: {exc}") from None
    except RecursionError:  # the route's depth check makes this unreachable; never a 500
        raise InvalidRequestError("The request body is nested too deeply.") from None


_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")
_INDEX = re.compile(r"\[(\d+)\]")


def _schema_error(text: str) -> InvalidRequestError:
    """msgspec's ``Expected `str`, got `int` - at `$.messages[0].role``` as Anthropic puts
    it: ``messages.0.role: Expected `str`, got `int```, with ``param`` set to the path."""
    match = _AT.search(text)
    message = text[: match.start()] if match else text
    path = _INDEX.sub(r".\1", match.group("path")).lstrip(".") if match else ""
    missing = _MISSING.search(message)
    if missing:
        path = f"{path}.{missing.group('field')}" if path else missing.group("field")
        message = "Field required"
    return invalid_at(path, message) if path else InvalidRequestError(message)
