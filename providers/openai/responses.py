"""OpenAI's Responses API passed through: the client's ``POST /responses`` body goes to an
upstream that serves it, and the upstream's answer comes back as it was sent.

The body keeps every field as raw JSON except two: ``model`` (the target's upstream model)
and ``store``, forced to false: the gateway keeps no responses and refuses
``previous_response_id``, so a stored response upstream could never be referred to through
it (and would only keep the client's data at the vendor for nothing).

The answers are also decoded into the canonical types, only for what the gateway itself
needs (usage and cost, the response cache, the ledger): text from ``output_text`` parts,
``function_call`` items as tool calls, usage (input/output/cached/reasoning tokens).
"""

from __future__ import annotations

import msgspec
from httpx_sse import ServerSentEvent

from core.errors import UpstreamMalformedError, UpstreamServerError
from core.wire import (
    AssistantMessage,
    ChatChunk,
    ChatResponse,
    Choice,
    ChunkChoice,
    CompletionTokensDetails,
    Delta,
    FunctionCall,
    FunctionDelta,
    PromptTokensDetails,
    ToolCall,
    ToolCallDelta,
    Usage,
)

_fields_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])
_encoder = msgspec.json.Encoder()
_FALSE = msgspec.Raw(b"false")
# The events after which an upstream sends nothing more.
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


def forward_body(raw: bytes, model: str) -> bytes:
    """The client's Responses body with ``model`` replaced and ``store`` false (see above);
    every other field goes upstream untouched, fields the gateway does not know included."""
    body = _fields_decoder.decode(raw)
    body["model"] = msgspec.Raw(_encoder.encode(model))
    body["store"] = _FALSE
    return _encoder.encode(body)


# -- the parts of a Responses answer the gateway reads ---------------------------------------


class _Content(msgspec.Struct):
    type: str = ""
    text: str | None = None
    refusal: str | None = None


class _Item(msgspec.Struct):
    type: str = ""
    id: str | None = None
    content: list[_Content] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None


class _InputDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _OutputDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct):
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int | None = None
    input_tokens_details: _InputDetails | None = None
    output_tokens_details: _OutputDetails | None = None


class _Incomplete(msgspec.Struct):
    reason: str | None = None


class _Response(msgspec.Struct):
    id: str = ""
    created_at: float = 0
    model: str = ""
    status: str | None = None
    output: list[_Item] = []
    usage: _Usage | None = None
    incomplete_details: _Incomplete | None = None


class _Event(msgspec.Struct):
    type: str = ""
    delta: str | msgspec.Raw | None = None
    response: _Response | None = None
    item: _Item | None = None
    item_id: str | None = None
    message: str | None = None
    code: str | None = None


_response_decoder = msgspec.json.Decoder(_Response)
_event_decoder = msgspec.json.Decoder(_Event)


def decode_response(body: bytes) -> ChatResponse:
    """A complete Responses answer as a canonical chat completion (raises msgspec errors
    on a body that is not one)."""
    response = _response_decoder.decode(body)
    calls = _tool_calls(response)
    text = "".join(_texts(response))
    message = AssistantMessage(content=text or None, tool_calls=calls or None)
    choice = Choice(index=0, message=message, finish_reason=_finish_reason(response, calls))
    return ChatResponse(
        id=response.id,
        created=int(response.created_at),
        model=response.model,
        choices=[choice],
        usage=_usage(response.usage),
    )


def _texts(response: _Response) -> list[str]:
    return [
        part.text
        for item in response.output
        if item.type == "message"
        for part in item.content or []
        if part.type == "output_text" and part.text
    ]


def _tool_calls(response: _Response) -> list[ToolCall]:
    return [
        ToolCall(item.call_id or "", FunctionCall(item.name or "", item.arguments or ""))
        for item in response.output
        if item.type == "function_call"
    ]


def _finish_reason(response: _Response, calls: list[ToolCall]) -> str:
    """The canonical finish reason: cut short (token limit, content filter), tool calls, or
    a plain stop."""
    reason = response.incomplete_details.reason if response.incomplete_details else None
    if response.status == "incomplete":
        return "content_filter" if reason == "content_filter" else "length"
    return "tool_calls" if calls else "stop"


def _usage(usage: _Usage | None) -> Usage | None:
    """Responses usage in the canonical names (reasoning tokens are within output tokens
    in both)."""
    if usage is None:
        return None
    cached = usage.input_tokens_details.cached_tokens if usage.input_tokens_details else None
    out = usage.output_tokens_details
    reasoning = out.reasoning_tokens if out else None
    total = usage.total_tokens
    return Usage(
        prompt_tokens=usage.input_tokens,
        completion_tokens=usage.output_tokens,
        total_tokens=total if total is not None else usage.input_tokens + usage.output_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached) if cached else None,
        completion_tokens_details=(
            CompletionTokensDetails(reasoning_tokens=reasoning) if reasoning else None
        ),
    )


class StreamReader:
    """Reads one upstream Responses stream, event by event, into canonical chunks.

    ``chunk(event)`` returns the canonical chunk for one event: a text delta for
    ``response.output_text.delta``; a tool-call delta for a ``function_call`` item added
    (id, name) and for ``response.function_call_arguments.delta``, as a chat stream sends
    them (so the response cache and the cut-stream estimate see the whole answer); the
    finish reason and usage for the terminal event; no choices otherwise. An ``error``
    event raises (the gateway then writes its own error events, or falls back before the
    first part). ``done`` turns true after a terminal event; ``check_ended()`` raises
    when the stream stopped before one.
    """

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.done = False
        self._id, self._created, self._model = "", 0, ""
        self._calls: dict[str, int] = {}  # function_call item id -> canonical tool index

    def chunk(self, event: ServerSentEvent) -> ChatChunk:
        parsed = _event_decoder.decode(event.data)
        kind = parsed.type or event.event
        if kind == "error":
            raise UpstreamServerError(
                f"upstream {self.provider} reported an error mid-stream: {parsed.message}",
                provider=self.provider,
                code="upstream_stream_error",
            )
        if parsed.response is not None:
            self._remember(parsed.response)
        choices: list[ChunkChoice] = []
        usage: Usage | None = None
        delta = self._delta(kind, parsed)
        if delta is not None:
            choices = [ChunkChoice(0, delta)]
        elif kind in TERMINAL and parsed.response is not None:
            self.done = True
            response = parsed.response
            reason = _finish_reason(response, _tool_calls(response))
            choices = [ChunkChoice(0, Delta(), finish_reason=reason)]
            usage = _usage(response.usage)
        return ChatChunk(self._id, self._created, self._model, choices, usage=usage)

    def _delta(self, kind: str, parsed: _Event) -> Delta | None:
        """The canonical delta of a text or tool-call event, else None."""
        text = parsed.delta if isinstance(parsed.delta, str) else None
        if kind == "response.output_text.delta" and text is not None:
            return Delta(content=text)
        item = parsed.item
        if kind == "response.output_item.added" and item and item.type == "function_call":
            index = self._calls.setdefault(item.id or "", len(self._calls))
            function = FunctionDelta(item.name or "", item.arguments or "")
            call = ToolCallDelta(index, id=item.call_id, type="function", function=function)
            return Delta(tool_calls=[call])
        index_of = self._calls.get(parsed.item_id or "")
        if kind == "response.function_call_arguments.delta" and text and index_of is not None:
            return Delta(tool_calls=[ToolCallDelta(index_of, function=FunctionDelta(None, text))])
        return None

    def check_ended(self) -> None:
        if not self.done:
            raise UpstreamMalformedError(
                f"upstream {self.provider} ended the stream before response.completed",
                provider=self.provider,
            )

    def _remember(self, response: _Response) -> None:
        self._id = response.id or self._id
        self._created = int(response.created_at) or self._created
        self._model = response.model or self._model


def event_bytes(event: ServerSentEvent) -> bytes:
    """One event framed again as the upstream sent it: its ``event:`` line when it had
    one, its data unchanged (httpx-sse keeps no raw bytes; OpenAI sends one data line)."""
    head = b"event: " + event.event.encode() + b"\n" if event.event != "message" else b""
    data = b"".join(b"data: " + line.encode() + b"\n" for line in event.data.split("\n"))
    return head + data + b"\n"
