"""The Anthropic Messages dialect: canonical chunks as Anthropic's server-sent events.

``StreamEncoder`` writes them in Anthropic's order: ``message_start``, ``ping``, per content
block ``content_block_start``, ``content_block_delta``\\* and ``content_block_stop``, then
``message_delta`` (stop reason, usage) and ``message_stop``; or an ``error`` event. Blocks,
stop reasons and usage map as ``anthropic_messages_encode`` says for a whole message.
"""

from __future__ import annotations

from typing import Literal

from core.errors import GatewayError
from core.wire import ChatChunk, Delta, ToolCallDelta, Usage
from gateway.dialects.anthropic_messages_encode import (
    delta_usage,
    error_out,
    stop_reason,
    tool_use_id,
)
from gateway.dialects.anthropic_messages_wire import (
    BlockDeltaEvent,
    BlockOut,
    BlockStartEvent,
    BlockStopEvent,
    InputJSONDelta,
    MessageDeltaBody,
    MessageDeltaEvent,
    MessageOut,
    MessageStartEvent,
    MessageStopEvent,
    PingEvent,
    TextDelta,
    TextOut,
    ThinkingDelta,
    ThinkingOut,
    ToolUseOut,
    UsageOut,
    sse,
)

BlockKind = Literal["text", "thinking"] | int
"""The open block: text, thinking, or the tool_use of this OpenAI tool-call index."""


class _PendingCall:
    """A tool call seen without its name yet: its block cannot start before the name."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.arguments: list[str] = []


class StreamEncoder:
    """Canonical chunks in, Anthropic SSE bytes out, for one answer.

    Call ``start`` once, ``feed`` per chunk, then ``finish`` (or ``error``); each returns
    the bytes to write (possibly empty). Blocks are numbered in the order they open; a block
    closes when another kind starts. Only choice 0 is read (this ingress never asks for n >
    1). Upstreams that interleave parallel tool calls get their later argument pieces sent to
    the block they belong to, after its ``content_block_stop``: the SDK accumulates by index,
    and dropping them would corrupt the input.
    """

    def __init__(
        self,
        model: str,
        message_id: str,
        *,
        input_tokens: int = 0,
        include_thinking: bool = True,
    ) -> None:
        self.model = model
        self.message_id = message_id
        self.input_tokens = input_tokens
        self.include_thinking = include_thinking
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.done = False
        self._open: BlockKind | None = None
        self._index = -1  # the index of the latest block
        self._blocks: dict[int, int] = {}  # tool-call index -> block index
        self._pending: dict[int, _PendingCall] = {}

    def start(self) -> bytes:
        """``message_start`` (empty content, the input tokens known so far) and a ``ping``."""
        usage = UsageOut(self.input_tokens, 0, 0, 0)
        message = MessageOut(self.message_id, "assistant", self.model, [], None, None, usage)
        return sse(MessageStartEvent(message)) + sse(PingEvent())

    def feed(self, chunk: ChatChunk) -> bytes:
        """The events for one chunk; remembers its finish reason and usage for ``finish``."""
        if self.done:
            return b""
        if chunk.usage is not None:
            self.usage = chunk.usage
        out: list[bytes] = []
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            self._delta(choice.delta, out)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
        return b"".join(out)

    def finish(
        self,
        usage: Usage | None = None,
        finish_reason: str | None = None,
        *,
        stop_sequence: str | None = None,
    ) -> bytes:
        """Close the open block, then ``message_delta`` (stop reason, cumulative usage) and
        ``message_stop``. Arguments override what the chunks said."""
        if self.done:
            return b""
        out: list[bytes] = []
        for index in list(self._pending):  # a call whose name never came still ends a block
            self._start_call(index, "", out)
        self._close(out)
        self.done = True
        reason = stop_reason(finish_reason or self.finish_reason, bool(self._blocks), stop_sequence)
        body = MessageDeltaBody(reason, stop_sequence)
        out.append(sse(MessageDeltaEvent(body, delta_usage(usage or self.usage))))
        out.append(sse(MessageStopEvent()))
        return b"".join(out)

    def error(self, exc: GatewayError, request_id: str | None = None) -> bytes:
        """The ``error`` event that ends a stream which failed after it started."""
        self.done = True
        return sse(error_out(exc, request_id))

    # ------------------------------------------------------------ blocks
    def _delta(self, delta: Delta, out: list[bytes]) -> None:
        if delta.reasoning_content and self.include_thinking:
            self._open_kind("thinking", out)
            out.append(sse(BlockDeltaEvent(self._index, ThinkingDelta(delta.reasoning_content))))
        text = delta.content or delta.refusal
        if text:
            self._open_kind("text", out)
            out.append(sse(BlockDeltaEvent(self._index, TextDelta(text))))
        for call in delta.tool_calls or ():
            self._tool_delta(call, out)

    def _open_kind(self, kind: Literal["text", "thinking"], out: list[bytes]) -> None:
        if self._open == kind:
            return
        self._close(out)
        self._begin(TextOut("") if kind == "text" else ThinkingOut(""), out)
        self._open = kind

    def _tool_delta(self, call: ToolCallDelta, out: list[bytes]) -> None:
        function = call.function
        arguments = function.arguments if function else None
        block = self._blocks.get(call.index)
        if block is not None:
            if arguments:
                out.append(sse(BlockDeltaEvent(block, InputJSONDelta(arguments))))
            return
        pending = self._pending.setdefault(call.index, _PendingCall())
        pending.id = call.id or pending.id
        if arguments:
            pending.arguments.append(arguments)
        if function is not None and function.name:
            self._start_call(call.index, function.name, out)

    def _start_call(self, index: int, name: str, out: list[bytes]) -> None:
        pending = self._pending.pop(index)
        self._close(out)
        self._begin(ToolUseOut(tool_use_id(pending.id), name, {}), out)
        self._open = index
        self._blocks[index] = self._index
        if pending.arguments:
            piece = InputJSONDelta("".join(pending.arguments))
            out.append(sse(BlockDeltaEvent(self._index, piece)))

    def _begin(self, block: BlockOut, out: list[bytes]) -> None:
        self._index += 1
        out.append(sse(BlockStartEvent(self._index, block)))

    def _close(self, out: list[bytes]) -> None:
        if self._open is not None:
            out.append(sse(BlockStopEvent(self._index)))
            self._open = None
