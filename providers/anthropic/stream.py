"""Anthropic streaming events -> OpenAI chat chunks (pure: no I/O, the clock comes in).

Anthropic's sequence is ``message_start``, then per content block ``content_block_start``,
``content_block_delta``\\* and ``content_block_stop``, then ``message_delta`` (stop reason,
cumulative usage) and ``message_stop``; ``ping`` may come anywhere and ``error`` may replace
the rest. OpenAI's sequence is a role chunk, content / tool-call deltas, a finish chunk and,
when asked for, a usage chunk with no choices.

``thinking`` blocks stream as ``reasoning_content`` deltas (a later thinking block starts with
a blank line, as ``convert.to_chat_response`` joins them); ``signature_delta`` and
``redacted_thinking`` blocks carry no readable text and are skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

from core.errors import (
    ProviderError,
    UpstreamBadRequestError,
    UpstreamMalformedError,
    UpstreamRateLimitedError,
    UpstreamServerError,
)
from core.wire import (
    ChatChunk,
    ChunkChoice,
    Delta,
    FinishReason,
    FunctionDelta,
    ToolCallDelta,
)
from providers.anthropic import wire
from providers.anthropic.convert import THINKING_SEPARATOR, finish_reason, to_usage

BlockKind = Literal["text", "json", "thinking", "skip"] | int
"""How one content block streams: as text, as the json_schema answer (text), as reasoning
text, not at all (redacted thinking and other kinds), or as the OpenAI tool call with this
index."""

_STREAM_ERRORS: dict[str, type[ProviderError]] = {
    "overloaded_error": UpstreamServerError,
    "api_error": UpstreamServerError,
    "rate_limit_error": UpstreamRateLimitedError,
    "invalid_request_error": UpstreamBadRequestError,
}


def stream_error(provider: str, error: wire.ErrorInfo) -> ProviderError:
    """The ProviderError for an ``error`` event sent in the middle of a stream."""
    cls = _STREAM_ERRORS.get(error.type, UpstreamServerError)
    return cls(
        f"upstream {provider} stream failed ({error.type}): {error.message}", provider=provider
    )


class StreamConverter:
    """Feed it each SSE event (name and data) in order; it returns the chunks to send.

    Raises ``UpstreamMalformedError`` for undecodable or out-of-order events, the mapped
    ``ProviderError`` for an ``error`` event, and (from ``finish``) when the stream ended
    before ``message_stop``.
    """

    def __init__(
        self, *, provider: str, created: int, include_usage: bool, json_tool: str | None
    ) -> None:
        self.provider = provider
        self.created = created
        self.include_usage = include_usage
        self.json_tool = json_tool
        self.id = ""
        self.model = ""
        self.started = False
        self.done = False
        self.usage = wire.ResponseUsage()
        self.stop_reason: str | None = None
        self._blocks: dict[int, BlockKind] = {}
        self._calls = 0
        self._thinking_blocks = 0
        self._handlers: dict[str, Callable[[str], list[ChatChunk]]] = {
            "message_start": self._message_start,
            "content_block_start": self._block_start,
            "content_block_delta": self._block_delta,
            "content_block_stop": self._block_stop,
            "message_delta": self._message_delta,
            "message_stop": self._message_stop,
            "error": self._error,
        }

    def feed(self, event: str, data: str) -> list[ChatChunk]:
        """Chunks for one event; ``ping`` and event kinds unknown here yield none."""
        handler = self._handlers.get(event)
        if handler is None or self.done:
            return []
        if not self.started and event not in ("message_start", "error"):
            raise self._malformed(f"'{event}' before message_start")
        try:
            return handler(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise self._malformed(f"bad '{event}' event: {exc}") from exc

    def finish(self) -> None:
        """Call when the upstream body ended: a stream without ``message_stop`` was cut."""
        if not self.done:
            raise self._malformed("the stream ended before message_stop (truncated)")

    # ------------------------------------------------------------ event handlers
    def _message_start(self, data: str) -> list[ChatChunk]:
        if self.started:
            raise self._malformed("a second message_start")
        message = wire.message_start_decoder.decode(data).message
        self.id, self.model, self.usage = message.id, message.model, message.usage
        self.started = True
        return [self._chunk(Delta(role="assistant", content=""))]

    def _block_start(self, data: str) -> list[ChatChunk]:
        event = wire.block_start_decoder.decode(data)
        block = event.content_block
        if block.type == "text":
            self._blocks[event.index] = "text"
            return [self._chunk(Delta(content=block.text))] if block.text else []
        if block.type == "thinking":
            return self._thinking_start(event.index, block.thinking or "")
        if block.type != "tool_use":
            self._blocks[event.index] = "skip"
            return []
        if block.id is None or block.name is None:
            raise self._malformed("a tool_use block without id or name")
        if block.name == self.json_tool:
            self._blocks[event.index] = "json"
            return []
        call = self._calls
        self._calls += 1
        self._blocks[event.index] = call
        function = FunctionDelta(name=block.name, arguments="")
        first = ToolCallDelta(index=call, id=block.id, type="function", function=function)
        return [self._chunk(Delta(tool_calls=[first]))]

    def _thinking_start(self, index: int, text: str) -> list[ChatChunk]:
        self._blocks[index] = "thinking"
        self._thinking_blocks += 1
        if self._thinking_blocks > 1:
            text = THINKING_SEPARATOR + text
        return [self._chunk(Delta(reasoning_content=text))] if text else []

    def _block_delta(self, data: str) -> list[ChatChunk]:
        event = wire.block_delta_decoder.decode(data)
        kind = self._blocks.get(event.index)
        if kind is None:
            raise self._malformed(f"a delta for content block {event.index}, never started")
        delta = event.delta
        if delta.type == "text_delta" and kind == "text" and delta.text:
            return [self._chunk(Delta(content=delta.text))]
        if delta.type == "thinking_delta" and kind == "thinking" and delta.thinking:
            return [self._chunk(Delta(reasoning_content=delta.thinking))]
        if delta.type != "input_json_delta" or not delta.partial_json:
            # signature_delta (opaque, only meaningful when sent back to Anthropic, which the
            # canonical form cannot do), citations and empty pieces carry nothing here
            return []
        if kind == "json":
            return [self._chunk(Delta(content=delta.partial_json))]
        if isinstance(kind, int):
            piece = ToolCallDelta(index=kind, function=FunctionDelta(arguments=delta.partial_json))
            return [self._chunk(Delta(tool_calls=[piece]))]
        return []

    def _block_stop(self, data: str) -> list[ChatChunk]:
        event = wire.block_stop_decoder.decode(data)
        if event.index not in self._blocks:
            raise self._malformed(f"content_block_stop for block {event.index}, never started")
        return []

    def _message_delta(self, data: str) -> list[ChatChunk]:
        event = wire.message_delta_decoder.decode(data)
        self.stop_reason = event.delta.stop_reason or self.stop_reason
        if event.usage is not None:
            self._merge_usage(event.usage)
        return []

    def _merge_usage(self, delta: wire.DeltaUsage) -> None:
        # message_delta counts are cumulative; fields it omits keep message_start's values
        for field in (
            "output_tokens",
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        ):
            value = getattr(delta, field)
            if value is not None:
                setattr(self.usage, field, value)

    def _message_stop(self, data: str) -> list[ChatChunk]:
        self.done = True
        reason: FinishReason = finish_reason(self.stop_reason, self.json_tool)
        chunks = [self._chunk(Delta(), reason)]
        if self.include_usage:
            chunks.append(self._usage_chunk())
        return chunks

    def _error(self, data: str) -> list[ChatChunk]:
        raise stream_error(self.provider, wire.error_decoder.decode(data).error)

    # ------------------------------------------------------------ helpers
    def _chunk(self, delta: Delta, reason: FinishReason | None = None) -> ChatChunk:
        choice = ChunkChoice(index=0, delta=delta, finish_reason=reason)
        return ChatChunk(id=self.id, created=self.created, model=self.model, choices=[choice])

    def _usage_chunk(self) -> ChatChunk:
        return ChatChunk(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=[],
            usage=to_usage(self.usage),
        )

    def _malformed(self, why: str) -> UpstreamMalformedError:
        return UpstreamMalformedError(
            f"upstream {self.provider} sent a malformed stream: {why}", provider=self.provider
        )
