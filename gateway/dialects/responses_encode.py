"""OpenAI's Responses API: a finished canonical answer as a ``response`` object, and the
error body of a request that failed before any answer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from core.errors import GatewayError
from core.wire import AssistantMessage, ChatResponse
from gateway.dialects.responses_wire import (
    FunctionCallItem,
    ItemIds,
    MessageItem,
    OutputItem,
    OutputRefusal,
    OutputText,
    ReasoningItem,
    SummaryText,
    response_object,
    response_status,
    response_usage,
)
from gateway.http import errors as http_errors

if TYPE_CHECKING:
    from gateway.dialects.responses import ResponsesIngress

_ENCODER = msgspec.json.Encoder()


def encode_response(
    resp: ChatResponse, ingress: ResponsesIngress, response_id: str, created_at: int
) -> bytes:
    """The ``response`` object for a finished canonical answer, as OpenAI returns it.

    ``output`` in order: a ``reasoning`` item (the thinking text as its summary) when there
    is reasoning content, a ``message`` item (``output_text`` and/or ``refusal``), then one
    ``function_call`` item per tool call. ``finish_reason`` ``length`` -> status
    ``incomplete`` with reason ``max_output_tokens`` (``content_filter`` likewise), the last
    item marked incomplete. Item ids derive from ``response_id`` and the output index, so
    they are stable and match what ``StreamEncoder`` sends. ``model`` is the client's alias."""
    ids = ItemIds(response_id)
    choice = resp.choices[0] if resp.choices else None
    status, incomplete = response_status(choice.finish_reason if choice else None)
    output = output_items(choice.message, ids) if choice else []
    if incomplete is not None and output:
        _mark_incomplete(output[-1])
    body = response_object(
        ingress,
        response_id,
        created_at,
        status=status,
        output=output,
        usage=response_usage(resp.usage),
        incomplete_details=incomplete,
    )
    return _ENCODER.encode(body)


def output_items(message: AssistantMessage, ids: ItemIds) -> list[OutputItem]:
    """The output items of one assistant message, in OpenAI's order."""
    items: list[OutputItem] = []
    if message.reasoning_content:
        summary = [SummaryText(message.reasoning_content)]
        items.append(ReasoningItem(id=ids.reasoning(len(items)), summary=summary))
    content: list[OutputText | OutputRefusal] = []
    if message.content or (message.content is not None and not message.tool_calls):
        content.append(OutputText(message.content))  # an empty answer is still an answer
    if message.refusal:
        content.append(OutputRefusal(message.refusal))
    if content:
        items.append(MessageItem(id=ids.message(len(items)), status="completed", content=content))
    for call in message.tool_calls or []:
        index = len(items)
        items.append(
            FunctionCallItem(
                id=ids.function_call(index),
                call_id=call.id or ids.call_id(index),
                name=call.function.name,
                arguments=call.function.arguments,
                status="completed",
            )
        )
    return items


def _mark_incomplete(item: OutputItem) -> None:
    if isinstance(item, MessageItem | FunctionCallItem):
        item.status = "incomplete"


def error_body(exc: GatewayError) -> bytes:
    """A non-stream error: the Responses API uses the same ``{"error": {message, type,
    param, code}}`` shape as Chat Completions."""
    return http_errors.error_body(exc)
