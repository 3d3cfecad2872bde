"""OpenAI-compatible wire helpers: error bodies and the request rewrite for passthrough."""

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


response_decoder = msgspec.json.Decoder(ChatResponse)
chunk_decoder = msgspec.json.Decoder(ChatChunk)
usage_decoder = msgspec.json.Decoder(_UsageOnly)
_error_decoder = msgspec.json.Decoder(_ErrorBody)
# Top-level fields as raw JSON: the rewrite touches three of them, and the rest go upstream
# byte for byte (numbers a float cannot hold, e.g. 1e309, included) without being parsed.
_fields_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])
_encoder = msgspec.json.Encoder()


def read_error(body: bytes) -> tuple[str, str | None]:
    """(message, param) of an OpenAI error body; vLLM-style string errors are accepted too."""
    error = _error_decoder.decode(body).error
    if isinstance(error, str):
        return error, None
    return error.message, error.param


def rewrite_body(
    raw: bytes, model: str, *, force_usage: bool = False, prompt_cache_key: str | None = None
) -> bytes:
    """The client's JSON with ``model`` replaced (and, for streams, usage requested).

    ``prompt_cache_key`` (OpenAI's prompt-cache routing hint, set per tenant by the gateway)
    is added when given and the client did not send one of its own: the client knows its
    traffic better. Every other field goes to the upstream untouched, also fields the
    gateway does not know.
    """
    body = _fields_decoder.decode(raw)
    body["model"] = msgspec.Raw(_encoder.encode(model))
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
