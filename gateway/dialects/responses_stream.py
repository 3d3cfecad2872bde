"""Canonical chat chunks -> the Responses API's server-sent events.

Event order, as OpenAI sends it (``sequence_number`` counts from 0 across the stream):

    response.created, response.in_progress                               start()
    reasoning:  output_item.added, reasoning_summary_part.added,
                reasoning_summary_text.delta*
                ... reasoning_summary_text.done, reasoning_summary_part.done,
                output_item.done
    text:       output_item.added (message), content_part.added,
                output_text.delta* (refusal.delta* for a refusal part)
                ... output_text.done, content_part.done, output_item.done
    tool calls: output_item.added (function_call), function_call_arguments.delta*
                ... function_call_arguments.done, output_item.done
    response.completed | response.incomplete                             finish()
    error, response.failed                                               error()

An item stays open until content of another kind arrives (then it is closed, with its
``*.done`` events) or the stream ends. The function calls of one turn form one group: they
all stay open until something else starts, so an upstream that interleaves the fragments of
parallel calls still yields whole arguments in every ``done`` event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypedDict

from core.errors import GatewayError
from core.wire import ChatChunk, ToolCallDelta, Usage
from gateway.dialects.responses_events import (
    ArgsDelta,
    ArgsDone,
    ErrorEvent,
    Event,
    ItemEvent,
    Lifecycle,
    PartEvent,
    RefusalDelta,
    RefusalDone,
    SummaryDelta,
    SummaryDone,
    SummaryPart,
    TextDelta,
    TextDone,
    sse,
)
from gateway.dialects.responses_wire import (
    FunctionCallItem,
    ItemIds,
    ItemStatus,
    MessageItem,
    OutputItem,
    OutputRefusal,
    OutputText,
    ReasoningItem,
    ResponseError,
    ResponseObject,
    Status,
    SummaryText,
    response_object,
    response_status,
    response_usage,
)

if TYPE_CHECKING:
    from gateway.dialects.responses import ResponsesIngress

PartKind = Literal["output_text", "refusal"]


# ---------------------------------------------------------------- open items
class _OpenReasoning:
    def __init__(self, item: ReasoningItem, index: int) -> None:
        self.item, self.index, self.texts = item, index, list[str]()


class _OpenMessage:
    def __init__(self, item: MessageItem, index: int) -> None:
        self.item, self.index = item, index
        self.part: PartKind | None = None  # the content part being written, if any
        self.texts: list[str] = []


class _OpenCall:
    def __init__(self, item: FunctionCallItem, index: int) -> None:
        self.item, self.index, self.fragments = item, index, list[str]()


_Open = _OpenReasoning | _OpenMessage | dict[int, _OpenCall]


class _Where(TypedDict):
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int


class StreamEncoder:
    """Turns one canonical chunk stream into Responses SSE bytes.

    Call ``start()`` once, ``feed()`` per chunk, then ``finish()`` or ``error()`` once. Each
    returns the bytes to send (possibly empty). Only choice 0 is read (the Responses API
    has no ``n``). Usage and the finish reason are remembered from the chunks, so
    ``finish()`` needs arguments only to override them."""

    def __init__(self, ingress: ResponsesIngress, response_id: str, created_at: int) -> None:
        self._ingress, self._id, self._created = ingress, response_id, created_at
        self._ids = ItemIds(response_id)
        self._seq = 0
        self._out: list[bytes] = []
        self._items: list[OutputItem] = []  # every item added, by output index
        self._open: _Open | None = None
        self._calls: dict[int, _OpenCall] = {}  # canonical tool-call index -> its item
        self._usage: Usage | None = None
        self._finish_reason: str | None = None
        self._ended = False

    # ------------------------------------------------------------ public
    def start(self) -> bytes:
        """``response.created`` then ``response.in_progress``, with the empty response."""
        for kind in ("response.created", "response.in_progress"):
            self._lifecycle(kind, self._response("in_progress"))
        return self._flush()

    def feed(self, chunk: ChatChunk) -> bytes:
        """The events for one chunk (empty when it carries nothing new)."""
        if chunk.usage is not None:
            self._usage = chunk.usage
        for choice in chunk.choices:
            if choice.index != 0 or self._ended:
                continue
            delta = choice.delta
            if delta.reasoning_content:
                self._reasoning(delta.reasoning_content)
            if delta.content:
                self._text("output_text", delta.content)
            if delta.refusal:
                self._text("refusal", delta.refusal)
            for call in delta.tool_calls or []:
                self._call(call)
            if choice.finish_reason is not None:
                self._finish_reason = choice.finish_reason
        return self._flush()

    def finish(self, usage: Usage | None = None, finish_reason: str | None = None) -> bytes:
        """Close what is open and send ``response.completed`` (or ``response.incomplete``
        when the answer was cut short) with the whole response: output and usage."""
        if self._ended:
            return b""
        self._ended = True
        status, incomplete = response_status(finish_reason or self._finish_reason)
        self._close(last_status="incomplete" if incomplete else "completed")
        final = self._response(status, usage or self._usage)
        final.incomplete_details = incomplete
        kind = "response.completed" if status == "completed" else "response.incomplete"
        self._lifecycle(kind, final)
        return self._flush()

    def error(self, exc: GatewayError) -> bytes:
        """An ``error`` event (for clients that watch for it) then ``response.failed`` with
        the output so far (open items marked incomplete, without their ``done`` events),
        the terminal event Codex CLI and the SDK's stream helper look for."""
        if self._ended:
            return b""
        self._ended = True
        self._emit(
            ErrorEvent(
                type="error",
                sequence_number=self._next(),
                code=exc.code or exc.type,
                message=exc.message,
                param=exc.param,
            )
        )
        self._close(last_status="incomplete", send=False)
        failed = self._response("failed", self._usage)
        # the SDK's ResponseError.code is a closed list: a rate limit or else a server error
        code = "rate_limit_exceeded" if exc.status == 429 else "server_error"
        failed.error = ResponseError(code, exc.message)
        self._lifecycle("response.failed", failed)
        return self._flush()

    # ------------------------------------------------------------ opening and writing
    def _reasoning(self, text: str) -> None:
        current = self._open
        if not isinstance(current, _OpenReasoning):
            self._close()
            index = len(self._items)
            current = _OpenReasoning(
                ReasoningItem(id=self._ids.reasoning(index), summary=[]), index
            )
            self._add(current.item)
            self._open = current
            self._emit(self._summary_part("response.reasoning_summary_part.added", current, ""))
        current.texts.append(text)
        self._emit(
            SummaryDelta(
                type="response.reasoning_summary_text.delta",
                sequence_number=self._next(),
                item_id=current.item.id,
                output_index=current.index,
                summary_index=0,
                delta=text,
            )
        )

    def _text(self, kind: PartKind, text: str) -> None:
        current = self._open
        if not isinstance(current, _OpenMessage):
            self._close()
            index = len(self._items)
            item = MessageItem(id=self._ids.message(index), status="in_progress", content=[])
            current = _OpenMessage(item, index)
            self._add(item)
            self._open = current
        if current.part != kind:
            self._close_part(current)
            current.part = kind
            self._emit(self._part_event("response.content_part.added", current, ""))
        current.texts.append(text)
        where = self._where(current)
        if kind == "output_text":
            self._emit(TextDelta(type="response.output_text.delta", delta=text, **where))
        else:
            self._emit(RefusalDelta(type="response.refusal.delta", delta=text, **where))

    def _call(self, delta: ToolCallDelta) -> None:
        if not isinstance(self._open, dict):
            self._close()
            self._open = {}
        state = self._calls.get(delta.index)
        if state is None:
            index = len(self._items)
            fn = delta.function
            item = FunctionCallItem(
                id=self._ids.function_call(index),
                call_id=delta.id or self._ids.call_id(index),
                name=(fn.name or "") if fn else "",
                arguments="",
                status="in_progress",
            )
            state = self._calls[delta.index] = self._open[delta.index] = _OpenCall(item, index)
            self._add(item)
        elif delta.function and delta.function.name and not state.item.name:
            state.item.name = delta.function.name  # a name that came after the first fragment
        # A fragment of a call already closed (upstreams send each call contiguously, so only
        # a broken one does this) still goes out as a delta and into the final response;
        # its item is not reopened, which would announce the same call twice.
        fragment = delta.function.arguments if delta.function else None
        if fragment:
            state.fragments.append(fragment)
            state.item.arguments = "".join(state.fragments)
            self._emit(
                ArgsDelta(
                    type="response.function_call_arguments.delta",
                    sequence_number=self._next(),
                    item_id=state.item.id,
                    output_index=state.index,
                    delta=fragment,
                )
            )

    # ------------------------------------------------------------ closing
    def _close(self, last_status: ItemStatus = "completed", *, send: bool = True) -> None:
        """Close the open item(s): fill in their final text and, when ``send``, their
        ``done`` events. ``last_status`` goes to the last item (the one a token limit cut)."""
        current, self._open = self._open, None
        if isinstance(current, _OpenReasoning):
            self._close_reasoning(current, send)
        elif isinstance(current, _OpenMessage):
            self._close_part(current, send)
            current.item.status = last_status
            if send:
                self._item_event("response.output_item.done", current.item, current.index)
        elif current:
            calls = sorted(current.values(), key=lambda call: call.index)
            for call in calls:
                status = last_status if call is calls[-1] else "completed"
                self._close_call(call, status, send)

    def _close_reasoning(self, current: _OpenReasoning, send: bool) -> None:
        text = "".join(current.texts)
        current.item.summary = [SummaryText(text)]
        if not send:
            return
        self._emit(
            SummaryDone(
                type="response.reasoning_summary_text.done",
                sequence_number=self._next(),
                item_id=current.item.id,
                output_index=current.index,
                summary_index=0,
                text=text,
            )
        )
        self._emit(self._summary_part("response.reasoning_summary_part.done", current, text))
        self._item_event("response.output_item.done", current.item, current.index)

    def _close_part(self, current: _OpenMessage, send: bool = True) -> None:
        if current.part is None:
            return
        text = "".join(current.texts)
        current.texts = []
        part = self._part(current.part, text)
        if send:
            where = self._where(current)
            if current.part == "output_text":
                self._emit(TextDone(type="response.output_text.done", text=text, **where))
            else:
                self._emit(RefusalDone(type="response.refusal.done", refusal=text, **where))
            self._emit(self._part_event("response.content_part.done", current, text))
        current.item.content.append(part)
        current.part = None

    def _close_call(self, call: _OpenCall, status: ItemStatus, send: bool) -> None:
        call.item.status = status
        if not send:
            return
        self._emit(
            ArgsDone(
                type="response.function_call_arguments.done",
                sequence_number=self._next(),
                item_id=call.item.id,
                output_index=call.index,
                arguments=call.item.arguments,
            )
        )
        self._item_event("response.output_item.done", call.item, call.index)

    # ------------------------------------------------------------ event helpers
    def _next(self) -> int:
        self._seq += 1
        return self._seq - 1

    def _emit(self, event: Event) -> None:
        self._out.append(sse(event))

    def _flush(self) -> bytes:
        out, self._out = b"".join(self._out), []
        return out

    def _response(self, status: Status, usage: Usage | None = None) -> ResponseObject:
        usage_out = response_usage(usage) if status != "in_progress" else None
        output = list(self._items) if status != "in_progress" else []
        return response_object(
            self._ingress, self._id, self._created, status=status, output=output, usage=usage_out
        )

    def _lifecycle(self, kind: str, response: ResponseObject) -> None:
        self._emit(Lifecycle(type=kind, sequence_number=self._next(), response=response))

    def _add(self, item: OutputItem) -> None:
        self._items.append(item)
        self._item_event("response.output_item.added", item, len(self._items) - 1)

    def _item_event(self, kind: str, item: OutputItem, index: int) -> None:
        # encoded now, so later changes to the item do not reach this event
        self._emit(
            ItemEvent(type=kind, sequence_number=self._next(), output_index=index, item=item)
        )

    def _where(self, current: _OpenMessage) -> _Where:
        """The next sequence number and the address of the message's open content part."""
        return _Where(
            sequence_number=self._next(),
            item_id=current.item.id,
            output_index=current.index,
            content_index=len(current.item.content),
        )

    def _part_event(self, kind: str, current: _OpenMessage, text: str) -> PartEvent:
        assert current.part is not None
        return PartEvent(part=self._part(current.part, text), type=kind, **self._where(current))

    @staticmethod
    def _part(kind: PartKind, text: str) -> OutputText | OutputRefusal:
        return OutputText(text) if kind == "output_text" else OutputRefusal(text)

    def _summary_part(self, kind: str, current: _OpenReasoning, text: str) -> SummaryPart:
        return SummaryPart(
            type=kind,
            sequence_number=self._next(),
            item_id=current.item.id,
            output_index=current.index,
            summary_index=0,
            part=SummaryText(text),
        )
