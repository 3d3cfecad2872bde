"""OpenAI-compatible wire helpers: error bodies, the request rewrite for passthrough, and the
decoding of answers into the canonical types.

Reasoning text: DeepSeek (and older vLLM) send ``reasoning_content``, which the
canonical ``AssistantMessage`` / ``Delta`` carry as such; current vLLM, OpenRouter and
gpt-oss servers send ``reasoning`` instead, which is copied into ``reasoning_content`` so
that codecs for other dialects see it either way. The raw bytes forwarded to chat clients are
not touched. ``usage.completion_tokens_details.reasoning_tokens`` decodes into ``Usage``.
"""

from __future__ import annotations

import msgspec

from core.wire import ChatChunk, ChatResponse, Usage


class _ErrorDetail(msgspec.Struct):
    message: str = ""
    param: str | None = None


class _ErrorBody(msgspec.Struct):
    error: _ErrorDetail | str


class _UsageOnly(msgspec.Struct):
    usage: Usage | None = None
    choices: list[msgspec.Raw] | None = None


class _Reasoning(msgspec.Struct):
    reasoning: str | None = None


class _ReasoningChoice(msgspec.Struct):
    message: _Reasoning | None = None
    delta: _Reasoning | None = None


class _ReasoningBody(msgspec.Struct):
    choices: list[_ReasoningChoice] = []


response_decoder = msgspec.json.Decoder(ChatResponse)
chunk_decoder = msgspec.json.Decoder(ChatChunk)
_reasoning_decoder = msgspec.json.Decoder(_ReasoningBody)
# Inside a JSON string a quote is escaped, so this only matches a key (or a bare string
# value, which costs one more decode and finds nothing).
_REASONING_KEY = b'"reasoning"'
usage_decoder = msgspec.json.Decoder(_UsageOnly)
_error_decoder = msgspec.json.Decoder(_ErrorBody)
# Top-level fields as raw JSON: the rewrite touches three of them, and the rest go upstream
# byte for byte (numbers a float cannot hold, e.g. 1e309, included) without being parsed.
_fields_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])
_encoder = msgspec.json.Encoder()


def decode_response(body: bytes) -> ChatResponse:
    """A chat completion, with ``reasoning`` moved into ``reasoning_content`` (see above)."""
    response = response_decoder.decode(body)
    for choice, found in zip(response.choices, _reasoning_of(body), strict=False):
        text = found.message.reasoning if found.message else None
        if text and choice.message.reasoning_content is None:
            choice.message.reasoning_content = text
    return response


def decode_chunk(data: bytes) -> ChatChunk:
    """A stream chunk, with ``delta.reasoning`` moved into ``reasoning_content``."""
    chunk = chunk_decoder.decode(data)
    for choice, found in zip(chunk.choices, _reasoning_of(data), strict=False):
        text = found.delta.reasoning if found.delta else None
        if text and choice.delta.reasoning_content is None:
            choice.delta.reasoning_content = text
    return chunk


def _reasoning_of(body: bytes) -> list[_ReasoningChoice]:
    """The ``reasoning`` fields per choice; none when the body has no such key (the common
    case: one substring scan) or uses it in a shape that is not a string (left alone: it is
    an optional extra, never a reason to fail an answer)."""
    if _REASONING_KEY not in body:
        return []
    try:
        return _reasoning_decoder.decode(body).choices
    except (msgspec.DecodeError, msgspec.ValidationError):
        return []


def read_error(body: bytes) -> tuple[str, str | None]:
    """(message, param) of an OpenAI error body; vLLM-style string errors are accepted too."""
    error = _error_decoder.decode(body).error
    if isinstance(error, str):
        return error, None
    return error.message, error.param


def rewrite_body(
    raw: bytes,
    model: str,
    *,
    force_usage: bool = False,
    prompt_cache_key: str | None = None,
    priority: int | None = None,
) -> bytes:
    """The client's JSON with ``model`` replaced (and, for streams, usage requested).

    ``prompt_cache_key`` (OpenAI's prompt-cache routing hint, set per tenant by the gateway)
    is added when given and the client did not send one of its own: the client knows its
    traffic better. Every other field goes to the upstream untouched, also fields the
    gateway does not know. ``priority`` (vLLM's scheduling field) replaces the client's:
    the gateway sets it for its own batch items only, to workers that schedule by it.
    """
    body = _fields_decoder.decode(raw)
    body["model"] = msgspec.Raw(_encoder.encode(model))
    if priority is not None:
        body["priority"] = msgspec.Raw(_encoder.encode(priority))
    if prompt_cache_key is not None and _is_null(body.get("prompt_cache_key")):
        body["prompt_cache_key"] = msgspec.Raw(_encoder.encode(prompt_cache_key))
    if force_usage:
        given = body.get("stream_options")
        options = {} if given is None or _is_null(given) else _fields_decoder.decode(given)
        options["include_usage"] = msgspec.Raw(b"true")
        body["stream_options"] = msgspec.Raw(_encoder.encode(options))
    return _encoder.encode(body)


def _is_null(value: msgspec.Raw | None) -> bool:
    return value is None or bytes(value) == b"null"  # msgspec's Raw holds no whitespace


def is_error_payload(data: bytes) -> bool:
    """True when a stream's data line carries an error object instead of a chunk."""
    try:
        _error_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return True
