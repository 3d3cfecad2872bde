"""The Anthropic Messages dialect: response side (canonical answer -> Anthropic's wire).

- ``encode_response``: a ``ChatResponse`` as an Anthropic ``message`` object.
- ``error_body`` / ``error_status``: Anthropic's error shape for a ``GatewayError``.
- The mappings both this and the stream (``anthropic_messages_stream.StreamEncoder``) use:
  ids, stop reasons, usage, tool input.

Mapping decisions (streams included):

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

import msgspec

from core.errors import GatewayError
from core.wire import AssistantMessage, ChatResponse, Usage
from gateway.dialects.anthropic_messages_wire import (
    BlockOut,
    DeltaUsageOut,
    ErrorInfo,
    ErrorOut,
    JSONObject,
    MessageOut,
    TextOut,
    ThinkingOut,
    ThinkingTokens,
    ToolUseOut,
    UsageOut,
)

_encoder = msgspec.json.Encoder()


# ---------------------------------------------------------------- shared mappings
def message_id(seed: str) -> str:
    """An Anthropic message id (``msg_...``) for an upstream or gateway id."""
    if seed.startswith("msg_"):
        return seed
    return "msg_" + seed.removeprefix("chatcmpl-")


def tool_use_id(call_id: str | None) -> str:
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
        blocks.append(ToolUseOut(tool_use_id(call.id), name, tool_input(arguments)))
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


def error_out(exc: GatewayError, request_id: str | None) -> ErrorOut:
    return ErrorOut(ErrorInfo(error_type(exc.status), error_message(exc)), request_id)


def error_body(exc: GatewayError, request_id: str | None = None) -> bytes:
    """``{"type": "error", "error": {"type": ..., "message": ...}, "request_id": ...}``."""
    return _encoder.encode(error_out(exc, request_id))
