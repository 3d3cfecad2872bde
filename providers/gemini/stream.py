"""``streamGenerateContent?alt=sse`` events -> OpenAI chunks (pure).

Each SSE ``data:`` payload is a whole ``GenerateContentResponse`` holding the next slice of
every candidate. Per choice the output follows OpenAI's order: a role chunk (content ""), the
content / tool-call deltas, then an empty delta with the finish reason; after the stream, a
``choices: []`` usage chunk when the client asked for one. Gemini sends a function call whole
in one event, so each call becomes a header delta (id, name, arguments "") and one delta with
all of its arguments. ``thought: true`` parts (thought summaries) become ``reasoning_content``
deltas. A stream that ends before every started choice saw a ``finishReason``
was cut off and is reported as malformed.
"""

from __future__ import annotations

from core.errors import UpstreamMalformedError
from core.wire import (
    ChatChunk,
    ChunkChoice,
    Delta,
    FinishReason,
    FunctionDelta,
    ToolCallDelta,
    Usage,
    make_usage,
)
from providers.gemini.response import finish_reason, is_blocked, tool_call, usage_of
from providers.gemini.wire import Candidate, GenerateContentResponse


class StreamConverter:
    """Turns one stream's events into chunks; one instance per stream.

    ``fallback_id`` / ``model`` apply until an event names ``responseId`` / ``modelVersion``.
    """

    def __init__(
        self, *, fallback_id: str, model: str, created: int, include_usage: bool, provider: str
    ) -> None:
        self.id = fallback_id
        self.model = model
        self.created = created
        self.include_usage = include_usage
        self.provider = provider
        self.usage: Usage | None = None
        self._named = False
        self._started: set[int] = set()
        self._finished: set[int] = set()
        self._calls: dict[int, int] = {}  # choice index -> tool calls emitted so far

    def feed(self, event: GenerateContentResponse) -> list[ChatChunk]:
        """The chunks one event adds."""
        if not self._named:
            self.id = event.response_id or self.id
            self.model = event.model_version or self.model
            self._named = True
        if event.usage_metadata is not None:
            # Every event carries the running totals; the last one is the answer's usage.
            self.usage = usage_of(event.usage_metadata)
        if is_blocked(event):
            if 0 in self._finished:
                return []
            self._finished.add(0)
            return [*self._start(0), self._chunk(0, Delta(), "content_filter")]
        chunks: list[ChatChunk] = []
        for candidate in sorted(event.candidates, key=lambda c: c.index):
            if candidate.index in self._finished:
                continue
            chunks += self._start(candidate.index)
            chunks += self._deltas(candidate)
            if candidate.finish_reason:
                called = self._calls.get(candidate.index, 0) > 0
                reason = finish_reason(candidate.finish_reason, called)
                chunks.append(self._chunk(candidate.index, Delta(), reason))
                self._finished.add(candidate.index)
        return chunks

    def close(self) -> list[ChatChunk]:
        """The chunks after the last event; raises if the stream was cut off."""
        if not self._finished or self._started - self._finished:
            raise UpstreamMalformedError(
                f"upstream {self.provider} stream ended before its finishReason",
                provider=self.provider,
            )
        if not self.include_usage:
            return []
        usage = self.usage or make_usage(0, 0)
        return [ChatChunk(self.id, self.created, self.model, choices=[], usage=usage)]

    def _chunk(self, index: int, delta: Delta, reason: FinishReason | None = None) -> ChatChunk:
        choice = ChunkChoice(index=index, delta=delta, finish_reason=reason)
        return ChatChunk(self.id, self.created, self.model, choices=[choice])

    def _start(self, index: int) -> list[ChatChunk]:
        if index in self._started:
            return []
        self._started.add(index)
        return [self._chunk(index, Delta(role="assistant", content=""))]

    def _deltas(self, candidate: Candidate) -> list[ChatChunk]:
        chunks: list[ChatChunk] = []
        index = candidate.index
        for part in candidate.content.parts if candidate.content else []:
            if part.thought:
                if part.text:
                    chunks.append(self._chunk(index, Delta(reasoning_content=part.text)))
                continue
            if part.text:
                chunks.append(self._chunk(index, Delta(content=part.text)))
            elif part.function_call is not None:
                chunks += self._call_deltas(
                    index, part.function_call.id, part.function_call.name, part.function_call.args
                )
        return chunks

    def _call_deltas(
        self, index: int, part_id: str | None, name: str, args: object
    ) -> list[ChatChunk]:
        number = self._calls.get(index, 0)
        self._calls[index] = number + 1
        call = tool_call(part_id, name, args, number)
        header = ToolCallDelta(
            index=number,
            id=call.id,
            type="function",
            function=FunctionDelta(name=name, arguments=""),
        )
        body = ToolCallDelta(
            index=number, function=FunctionDelta(arguments=call.function.arguments)
        )
        return [
            self._chunk(index, Delta(tool_calls=[header])),
            self._chunk(index, Delta(tool_calls=[body])),
        ]
