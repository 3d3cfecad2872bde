"""OpenAI-compatible wire helpers: error bodies and the request rewrite for passthrough."""

from __future__ import annotations

from typing import Any

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
_dict_decoder = msgspec.json.Decoder(dict[str, Any])
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
    body = _dict_decoder.decode(raw)
    body["model"] = model
    if prompt_cache_key is not None and body.get("prompt_cache_key") is None:
        body["prompt_cache_key"] = prompt_cache_key
    if force_usage:
        options = body.get("stream_options") or {}
        body["stream_options"] = {**options, "include_usage": True}
    return _encoder.encode(body)


def is_error_payload(data: bytes) -> bool:
    """True when a stream's data line carries an error object instead of a chunk."""
    try:
        _error_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return True
