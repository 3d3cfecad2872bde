"""OpenAI's Responses API (``POST /v1/responses``) as a codec over the canonical chat form.

Pure and synchronous: bytes in, canonical ``ChatRequest`` out; canonical ``ChatResponse`` in,
bytes out. This module decodes a request (``decode_request``); the dialect's other modules,
by job (the names a route needs are re-exported here):

- ``responses_to_chat``: input items, tools, ``tool_choice`` and ``text.format`` as their
  canonical forms (the mapping, item by item, is in its doc).
- ``responses_wire``: the shapes both directions share (echoed request fields, output items,
  usage, the ``response`` object).
- ``responses_encode``: a finished answer as a ``response`` object (``encode_response``),
  and ``error_body``.
- ``responses_stream``: canonical chunks as the API's events (``StreamEncoder``), whose
  shapes are in ``responses_events``.

Request mapping (Responses -> Chat Completions), besides what ``responses_to_chat`` does:

- ``instructions`` and ``input`` -> the messages; ``tools``, ``tool_choice``, ``text.format``
  -> their canonical fields. ``reasoning.effort`` -> ``reasoning_effort`` (``xhigh``/``max``
  -> ``high``, the canonical ceiling). ``max_output_tokens`` -> ``max_completion_tokens``;
  ``user`` (else ``safety_identifier``) -> ``user``; ``temperature``, ``top_p``,
  ``parallel_tool_calls``, ``stream`` as they are.
- Stored-state features the canonical form cannot carry are refused: ``conversation``,
  ``prompt`` (a stored prompt template), ``background: true``. ``previous_response_id`` and
  ``store`` are left to the route (``ResponsesIngress``). Unknown fields are ignored (they
  stay in ``ResponsesIngress.raw`` for a passthrough).

Response mapping: see ``encode_response``. Error ``param`` values are JSON paths in OpenAI's
own notation, e.g. ``input[2].content[0].file_id``.
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import Raw, Struct

from core.errors import InvalidRequestError
from core.wire import (
    ChatRequest,
    Count,
    ModelName,
    ReasoningEffort,
    StreamOptions,
    Temperature,
    UnitFloat,
)
from gateway.dialects.responses_encode import encode_response, error_body
from gateway.dialects.responses_stream import StreamEncoder
from gateway.dialects.responses_to_chat import (
    to_messages,
    to_response_format,
    to_tool_choice,
    to_tools,
)
from gateway.dialects.responses_wire import (
    FunctionToolSpec,
    ReasoningConfig,
    TextConfig,
    ToolChoiceSpec,
)
from gateway.http import errors as http_errors

__all__ = [
    "ResponsesIngress",
    "StreamEncoder",
    "decode_request",
    "encode_response",
    "error_body",
]


# ---------------------------------------------------------------- request shape
class _Request(Struct):
    """The request fields this codec reads; everything else is ignored here."""

    model: ModelName
    input: str | list[Raw]
    instructions: str | None = None
    tools: list[FunctionToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceSpec | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: Count | None = None
    temperature: Temperature | None = None
    top_p: UnitFloat | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None
    conversation: Raw | None = None
    prompt: Raw | None = None


_REQUEST = msgspec.json.Decoder(_Request)
# OpenAI's efforts above the canonical ceiling; the strongest canonical effort is the
# closest thing every target understands.
_EFFORTS: dict[str, ReasoningEffort] = {
    "none": "none",
    "minimal": "minimal",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


class ResponsesIngress(Struct, kw_only=True):
    """One decoded Responses request: the canonical request plus what the route and the
    response object need. ``chat.messages`` starts with the ``instructions`` system message
    when ``instructions`` is set (history from ``previous_response_id`` goes after it).

    The echo fields hold what the client sent (``None`` when it sent nothing), except
    ``tools`` (function tools only, ``[]`` when none), ``tool_choice`` (default ``auto``)
    and ``parallel_tool_calls`` (default true), which a response object always carries."""

    chat: ChatRequest
    raw: bytes
    stream: bool
    store: bool
    previous_response_id: str | None
    instructions: str | None
    tools: list[FunctionToolSpec]
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceSpec
    parallel_tool_calls: bool
    text: TextConfig | None
    reasoning: ReasoningConfig | None
    temperature: float | None
    top_p: float | None
    max_output_tokens: int | None
    metadata: dict[str, str] | None
    truncation: Literal["auto", "disabled"] | None
    user: str | None


# ---------------------------------------------------------------- request: decode
def decode_request(raw: bytes) -> ResponsesIngress:
    """The canonical form of the Responses request ``raw``.

    Raises ``InvalidRequestError`` (400) with ``param`` set for a body that is not JSON, not
    the schema, nested too deep, or asks for what the canonical form cannot carry."""
    req: _Request = http_errors.decode_body(_REQUEST, raw)
    _refuse_stateful(req)
    tools = req.tools or []
    chat = ChatRequest(
        model=req.model,
        messages=to_messages(req.instructions, req.input),
        stream=req.stream,
        # a Responses stream always ends with usage, so the upstream must send it
        stream_options=StreamOptions(include_usage=True) if req.stream else None,
        tools=to_tools(tools),
        tool_choice=to_tool_choice(req.tool_choice),
        parallel_tool_calls=req.parallel_tool_calls,
        response_format=to_response_format(req.text),
        max_completion_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        user=req.user or req.safety_identifier,
        reasoning_effort=_effort(req.reasoning),
    )
    return ResponsesIngress(
        chat=chat,
        raw=raw,
        stream=req.stream,
        store=True if req.store is None else req.store,  # OpenAI's default
        previous_response_id=req.previous_response_id,
        instructions=req.instructions,
        tools=tools,
        tool_choice="auto" if req.tool_choice is None else req.tool_choice,
        parallel_tool_calls=True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        text=req.text,
        reasoning=req.reasoning,
        temperature=req.temperature,
        top_p=req.top_p,
        max_output_tokens=req.max_output_tokens,
        metadata=req.metadata,
        truncation=req.truncation,
        user=req.user,
    )


def _effort(reasoning: ReasoningConfig | None) -> ReasoningEffort | None:
    return _EFFORTS[reasoning.effort] if reasoning and reasoning.effort else None


def _refuse_stateful(req: _Request) -> None:
    """400s for features that live in OpenAI's own stores and have no canonical form."""
    if req.conversation is not None and bytes(req.conversation) != b"null":
        raise InvalidRequestError(
            "conversation objects are stored by OpenAI and are not available through this "
            "gateway; send the conversation as input items",
            param="conversation",
        )
    if req.prompt is not None and bytes(req.prompt) != b"null":
        raise InvalidRequestError(
            "stored prompt templates are not available through this gateway; send the "
            "prompt as instructions and input",
            param="prompt",
        )
    if req.background:
        raise InvalidRequestError(
            "background responses are not supported by this gateway; use stream: true for "
            "long responses",
            param="background",
        )


ResponsesBody = _Request  # the request's schema, for the OpenAPI document
