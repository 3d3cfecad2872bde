"""The client's own Messages body sent to an Anthropic target: no round trip through the
canonical form, so ``cache_control`` placement, signed thinking blocks, server tools and
fields this gateway does not know reach Anthropic exactly (issue 11, decision 0009).

``call`` and ``stream`` take the raw body of a ``POST /v1/messages`` request and change only:

- ``model``: the target's upstream model;
- ``thinking`` blocks with an empty (or no) ``signature`` are dropped from ``messages``: the
  gateway writes them into answers that came from non-Anthropic targets (the SDK needs the
  field, nobody else can sign), and Anthropic refuses them when they come back in history.

Every other top-level field keeps the client's bytes (``dict[str, msgspec.Raw]``); only
insignificant whitespace between top-level fields may change. Headers: the provider's own
(``x-api-key``, ``anthropic-version``, configured extras), plus the client's
``anthropic-beta`` merged with any configured one. Errors map exactly as for the translated
call, so fallback behaves the same. The answer also comes converted to the canonical form
(usage, cost, cache, ledger), next to Anthropic's own bytes.

The gateway's automatic ``cache_control`` breakpoints (``ctx.cache_control_min_chars``) are
not added here: a client that sends its own body placed its breakpoints where it wants them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
import msgspec

from core.errors import UpstreamMalformedError
from core.protocols import CallContext
from core.wire import ChatChunk, ChatResult, StreamPart
from providers.anthropic import convert, wire
from providers.anthropic.adapter import AnthropicProvider, read_error_message
from providers.anthropic.stream import StreamConverter
from providers.http import mapped_errors, timeout_for

_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])
_raw_list = msgspec.json.Decoder(list[msgspec.Raw])
_encoder = msgspec.json.Encoder()
BETA = "anthropic-beta"


class _BlockHead(msgspec.Struct):
    """The two fields of a content block that decide whether it is dropped."""

    type: str = ""
    signature: str | None = None


_block_head = msgspec.json.Decoder(_BlockHead)


# ---------------------------------------------------------------- the body
def rewrite_body(raw: bytes, model: str) -> bytes:
    """The client's body for ``model`` (see the module docstring for what changes).
    Raises ``msgspec.DecodeError`` for a body that is not a JSON object (the route decoded
    it already, so this does not happen in practice)."""
    body = _fields.decode(raw)
    body["model"] = msgspec.Raw(_encoder.encode(model))
    messages = body.get("messages")
    if messages is not None and b'"thinking"' in bytes(messages):
        body["messages"] = _without_unsigned_thinking(messages)
    return _encoder.encode(body)


def _without_unsigned_thinking(messages: msgspec.Raw) -> msgspec.Raw:
    """``messages`` with unsigned thinking blocks dropped; the same bytes when none is."""
    turns = _raw_list.decode(messages)
    changed = False
    for position, turn in enumerate(turns):
        fields = _fields.decode(turn)
        content = fields.get("content")
        if content is None or not bytes(content).lstrip().startswith(b"["):
            continue  # string content has no blocks
        blocks = _raw_list.decode(content)
        kept = [block for block in blocks if not _unsigned_thinking(block)]
        if len(kept) != len(blocks):
            fields["content"] = msgspec.Raw(_encoder.encode(kept))
            turns[position] = msgspec.Raw(_encoder.encode(fields))
            changed = True
    return msgspec.Raw(_encoder.encode(turns)) if changed else messages


def _unsigned_thinking(block: msgspec.Raw) -> bool:
    try:
        head = _block_head.decode(block)
    except msgspec.ValidationError:  # not an object, or odd field types: not ours to judge
        return False
    return head.type == "thinking" and not head.signature


def merged_beta(configured: str | None, client: str | None) -> str | None:
    """One ``anthropic-beta`` value: the configured features, then the client's, each once."""
    names: list[str] = []
    for value in (configured, client):
        for piece in (value or "").split(","):
            name = piece.strip()
            if name and name not in names:
                names.append(name)
    return ",".join(names) or None


def _headers(provider: AnthropicProvider, beta: str | None, *, stream: bool) -> dict[str, str]:
    headers = provider._headers()
    configured = next((v for k, v in headers.items() if k.lower() == BETA), None)
    headers = {k: v for k, v in headers.items() if k.lower() != BETA}
    value = merged_beta(configured, beta)
    if value is not None:
        headers[BETA] = value
    if stream:
        headers["accept"] = "text/event-stream"
    return headers


# ---------------------------------------------------------------- calls
async def call(
    provider: AnthropicProvider, raw: bytes, ctx: CallContext, beta: str | None = None
) -> ChatResult:
    """One non-streaming call: ``ChatResult(response=<canonical>, raw=<Anthropic's JSON>)``."""
    with mapped_errors(provider.name):
        body = rewrite_body(raw, ctx.upstream_model)
    headers = _headers(provider, beta, stream=False)
    answer = await provider.post_bytes(provider.url, body, headers, ctx, read_error_message)
    with mapped_errors(provider.name):
        message = wire.response_decoder.decode(answer)
    converted = convert.to_chat_response(
        message, created=int(time.time()), json_tool=None, provider=provider.name
    )
    return ChatResult(converted, raw=answer)


async def stream(
    provider: AnthropicProvider, raw: bytes, ctx: CallContext, beta: str | None = None
) -> AsyncIterator[StreamPart]:
    """One ``StreamPart`` per upstream event, in order: ``raw`` is the event as Anthropic sent
    it (``event: ...\\ndata: ...\\n\\n``), ``chunk`` its canonical meaning (an empty-choices
    chunk when it has none; the usage chunk comes with ``message_stop``). Errors, also
    mid-stream ``error`` events and cut streams, raise the mapped ``ProviderError``."""
    with mapped_errors(provider.name):
        body = rewrite_body(raw, ctx.upstream_model)
    request = provider.client.build_request(
        "POST",
        provider.url,
        content=body,
        headers=_headers(provider, beta, stream=True),
        timeout=timeout_for(ctx),
    )
    converter = StreamConverter(
        provider=provider.name, created=int(time.time()), include_usage=True, json_tool=None
    )
    response = await provider.send(request, read_error_message, stream=True)
    try:
        _check_event_stream(provider.name, response)
        with mapped_errors(provider.name):
            async for name, data, event in raw_events(response):
                yield StreamPart(_one_chunk(converter, converter.feed(name, data)), raw=event)
            converter.finish()
    finally:
        await response.aclose()


def _one_chunk(converter: StreamConverter, chunks: list[ChatChunk]) -> ChatChunk:
    """The chunks of one event as one (``message_stop`` gives the finish and the usage)."""
    if len(chunks) == 1:
        return chunks[0]
    usage = next((c.usage for c in reversed(chunks) if c.usage is not None), None)
    choices = [choice for chunk in chunks for choice in chunk.choices]
    return ChatChunk(
        id=converter.id,
        created=converter.created,
        model=converter.model,
        choices=choices,
        usage=usage,
    )


def _check_event_stream(provider: str, response: httpx.Response) -> None:
    kind = response.headers.get("content-type", "").partition(";")[0]
    if "text/event-stream" not in kind:
        raise UpstreamMalformedError(
            f"upstream {provider} sent a malformed stream: content-type {kind!r}",
            provider=provider,
        )


async def raw_events(response: httpx.Response) -> AsyncIterator[tuple[str, str, bytes]]:
    """(event name, data, the event's bytes) per server-sent event. The bytes are the event's
    lines as received, ``\\n``-joined, plus the blank line that ends it; ``data`` joins
    several ``data:`` lines with ``\\n``, as the SSE spec says. Events with no data (comments
    only) are skipped."""
    lines: list[str] = []
    async for line in response.aiter_lines():
        if line:
            lines.append(line)
            continue
        if lines:
            parsed = _parse(lines)
            if parsed is not None:
                yield (*parsed, ("\n".join(lines) + "\n\n").encode())
            lines = []
    if lines:  # a last event without its blank line: the stream was cut inside it
        parsed = _parse(lines)
        if parsed is not None:
            yield (*parsed, ("\n".join(lines) + "\n\n").encode())


def _parse(lines: list[str]) -> tuple[str, str] | None:
    name, data = "message", []
    for line in lines:
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    return (name, "\n".join(data)) if data else None


# ---------------------------------------------------------------- the client's view
def with_model(raw: bytes, model: str) -> bytes:
    """Anthropic's message JSON with ``model`` set to ``model`` (the alias the client asked
    for); every other field keeps Anthropic's bytes."""
    fields = _fields.decode(raw)
    fields["model"] = msgspec.Raw(_encoder.encode(model))
    return _encoder.encode(fields)


MESSAGE_START = b"event: message_start\n"


def event_with_model(event: bytes, model: str) -> bytes:
    """A ``message_start`` event with its message's ``model`` set to ``model``; other events
    (and one that does not parse) as they are."""
    if not event.startswith(MESSAGE_START):
        return event
    head, sep, data = event[len(MESSAGE_START) :].partition(b"data: ")
    if head or not sep:
        return event
    try:
        fields = _fields.decode(data.rstrip(b"\n"))
        message = fields.get("message")
        if message is None:
            return event
        fields["message"] = msgspec.Raw(with_model(message, model))
    except msgspec.DecodeError:
        return event
    return MESSAGE_START + b"data: " + _encoder.encode(fields) + b"\n\n"
