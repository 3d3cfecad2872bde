"""The Responses API's server-sent events: their shapes, and ``sse`` that frames one as
``event: <type>`` and ``data: <json>``. ``responses_stream.StreamEncoder`` sends them, in
the order its doc gives."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct

from gateway.dialects.responses_wire import (
    OutputItem,
    OutputRefusal,
    OutputText,
    ResponseObject,
    SummaryText,
)


class Lifecycle(Struct, kw_only=True):
    type: str
    sequence_number: int
    response: ResponseObject


class ItemEvent(Struct, kw_only=True):
    type: str
    sequence_number: int
    output_index: int
    item: OutputItem


class PartEvent(Struct, kw_only=True):
    type: str
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputText | OutputRefusal


class TextDelta(Struct, kw_only=True):
    type: str
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = []


class TextDone(Struct, kw_only=True):
    type: str
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = []


class RefusalDelta(Struct, kw_only=True):
    type: str
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str


class RefusalDone(Struct, kw_only=True):
    type: str
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    refusal: str


class SummaryPart(Struct, kw_only=True):
    type: str
    sequence_number: int
    item_id: str
    output_index: int
    summary_index: int
    part: SummaryText


class SummaryDelta(Struct, kw_only=True):
    type: str
    sequence_number: int
    item_id: str
    output_index: int
    summary_index: int
    delta: str


class SummaryDone(Struct, kw_only=True):
    type: str
    sequence_number: int
    item_id: str
    output_index: int
    summary_index: int
    text: str


class ArgsDelta(Struct, kw_only=True):
    type: str
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class ArgsDone(Struct, kw_only=True):
    type: str
    sequence_number: int
    item_id: str
    output_index: int
    arguments: str


class ErrorEvent(Struct, kw_only=True):
    type: str
    sequence_number: int
    code: str | None
    message: str
    param: str | None


Event = (
    Lifecycle
    | ItemEvent
    | PartEvent
    | TextDelta
    | TextDone
    | RefusalDelta
    | RefusalDone
    | SummaryPart
    | SummaryDelta
    | SummaryDone
    | ArgsDelta
    | ArgsDone
    | ErrorEvent
)

_ENCODER = msgspec.json.Encoder()


def sse(event: Event) -> bytes:
    """One event as the API frames it: ``event: <type>``, ``data: <json>``, a blank line."""
    return b"event: " + event.type.encode() + b"\ndata: " + _ENCODER.encode(event) + b"\n\n"
