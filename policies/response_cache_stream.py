"""Cached answers as streams and streams as cached answers.

``chunks_of`` replays a stored ``ChatResponse`` as the chunk sequence OpenAI streams;
``StreamAccumulator`` folds a streamed answer back into one ``ChatResponse`` so it can be
stored. The two are inverses: ``accumulate(chunks_of(r, include_usage=True)) == r``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from core.wire import (
    AssistantMessage,
    ChatChunk,
    ChatResponse,
    Choice,
    ChunkChoice,
    Delta,
    FunctionCall,
    FunctionDelta,
    JSONObject,
    ToolCall,
    ToolCallDelta,
    Usage,
)


# ---------------------------------------------------------------- response -> chunks
def chunks_of(response: ChatResponse, include_usage: bool) -> list[ChatChunk]:
    """OpenAI's chunk sequence for ``response``: per choice a role delta, the content (and
    refusal) delta, one header delta (id, name) and one arguments delta per tool call with its
    ``index``, and a finish chunk; then, when ``include_usage``, a chunk with empty
    ``choices`` carrying the usage (as OpenAI sends with ``stream_options.include_usage``)."""
    chunks: list[ChatChunk] = []
    for choice in response.choices:
        chunks.extend(_chunk(response, choice.index, delta) for delta in _deltas(choice.message))
        finish = ChunkChoice(choice.index, Delta(), choice.finish_reason, None)
        chunks.append(_with_choice(response, finish))
    if include_usage and response.usage is not None:
        chunks.append(_usage_chunk(response, response.usage))
    _attach_logprobs(response, chunks)
    return chunks


def _deltas(message: AssistantMessage) -> list[Delta]:
    # The role delta carries content "" only when there is content, so that a message whose
    # content is None (a pure tool call) comes back as None, not "".
    deltas = [Delta(role="assistant", content="" if message.content is not None else None)]
    if message.content:
        deltas.append(Delta(content=message.content))
    if message.refusal is not None:
        deltas.append(Delta(refusal=message.refusal))
    for index, call in enumerate(message.tool_calls or []):
        header = FunctionDelta(name=call.function.name, arguments="")
        deltas.append(Delta(tool_calls=[ToolCallDelta(index, call.id, "function", header)]))
        if call.function.arguments:
            body = FunctionDelta(arguments=call.function.arguments)
            deltas.append(Delta(tool_calls=[ToolCallDelta(index, function=body)]))
    return deltas


def _chunk(response: ChatResponse, index: int, delta: Delta) -> ChatChunk:
    return _with_choice(response, ChunkChoice(index, delta))


def _with_choice(response: ChatResponse, choice: ChunkChoice) -> ChatChunk:
    return ChatChunk(
        id=response.id,
        created=response.created,
        model=response.model,
        choices=[choice],
        system_fingerprint=response.system_fingerprint,
    )


def _usage_chunk(response: ChatResponse, usage: Usage) -> ChatChunk:
    return ChatChunk(
        id=response.id,
        created=response.created,
        model=response.model,
        choices=[],
        usage=usage,
        system_fingerprint=response.system_fingerprint,
    )


def _attach_logprobs(response: ChatResponse, chunks: list[ChatChunk]) -> None:
    """A choice's whole ``logprobs`` rides on its role chunk (the first of that choice);
    the accumulator concatenates the token lists, so one carrier is enough."""
    for choice in response.choices:
        if choice.logprobs is None:
            continue
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].index == choice.index:
                chunk.choices[0].logprobs = choice.logprobs
                break


# ---------------------------------------------------------------- chunks -> response
class _ToolCallParts:
    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments = ""

    def feed(self, delta: ToolCallDelta) -> None:
        if delta.id:
            self.id = delta.id
        if delta.function is not None:
            self.name += delta.function.name or ""
            self.arguments += delta.function.arguments or ""

    def build(self) -> ToolCall:
        return ToolCall(id=self.id, function=FunctionCall(self.name, self.arguments))


class _ChoiceParts:
    def __init__(self) -> None:
        self.content: str | None = None
        self.refusal: str | None = None
        self.tool_calls: dict[int, _ToolCallParts] = {}
        self.finish_reason: str | None = None
        self.logprobs: JSONObject | None = None

    def feed(self, choice: ChunkChoice) -> None:
        delta = choice.delta
        if delta.content is not None:
            self.content = (self.content or "") + delta.content
        if delta.refusal is not None:
            self.refusal = (self.refusal or "") + delta.refusal
        for call in delta.tool_calls or []:
            self.tool_calls.setdefault(call.index, _ToolCallParts()).feed(call)
        if choice.finish_reason is not None:
            self.finish_reason = choice.finish_reason
        if choice.logprobs is not None:
            self.logprobs = _merge_logprobs(self.logprobs, choice.logprobs)

    def build(self, index: int) -> Choice:
        calls = [self.tool_calls[i].build() for i in sorted(self.tool_calls)]
        message = AssistantMessage(self.content, calls or None, self.refusal)
        return Choice(index, message, self.finish_reason, self.logprobs)


def _merge_logprobs(old: JSONObject | None, new: JSONObject) -> JSONObject:
    """Streamed logprobs arrive as ``{"content": [...], "refusal": [...]}`` per chunk; the
    answer's logprobs are the lists concatenated."""
    if old is None:
        return dict(new)
    merged: dict[str, Any] = dict(old)
    for name, value in new.items():
        if isinstance(value, list) and isinstance(merged.get(name), list):
            merged[name] = merged[name] + value
        elif value is not None or name not in merged:
            merged[name] = value
    return merged


class StreamAccumulator:
    """Folds a stream's chunks into the ``ChatResponse`` the same call would have returned
    without streaming: content and refusals concatenated, tool-call deltas merged by their
    ``index``, the last finish_reason per choice, the last usage seen."""

    def __init__(self) -> None:
        self._id = ""
        self._created = 0
        self._model = ""
        self._fingerprint: str | None = None
        self._usage: Usage | None = None
        self._choices: dict[int, _ChoiceParts] = {}
        self._seen = False

    def add(self, chunk: ChatChunk) -> None:
        """Fold one chunk in (chunks must come in stream order)."""
        if not self._seen:
            self._id, self._created, self._model = chunk.id, chunk.created, chunk.model
            self._seen = True
        if chunk.system_fingerprint is not None:
            self._fingerprint = chunk.system_fingerprint
        if chunk.usage is not None:
            self._usage = chunk.usage
        for choice in chunk.choices:
            self._choices.setdefault(choice.index, _ChoiceParts()).feed(choice)

    def add_all(self, chunks: Iterable[ChatChunk]) -> StreamAccumulator:
        for chunk in chunks:
            self.add(chunk)
        return self

    @property
    def finished(self) -> bool:
        """True when at least one choice arrived and every choice has a finish_reason: only
        then is the answer complete enough to store."""
        parts = self._choices.values()
        return bool(self._choices) and all(p.finish_reason is not None for p in parts)

    def result(self) -> ChatResponse:
        choices = [self._choices[i].build(i) for i in sorted(self._choices)]
        return ChatResponse(
            id=self._id,
            created=self._created,
            model=self._model,
            choices=choices,
            usage=self._usage,
            system_fingerprint=self._fingerprint,
        )


def accumulate(chunks: Iterable[ChatChunk]) -> ChatResponse:
    """The ``ChatResponse`` that ``chunks`` add up to."""
    return StreamAccumulator().add_all(chunks).result()
