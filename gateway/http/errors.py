"""Every failure leaves the gateway in the client's error shape with the right status:
OpenAI's by default, a route's own (Anthropic's on ``/v1/messages``) through
``exception_handlers(shape)``."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import numpy as np
import structlog
from litestar import Request, Response
from litestar.exceptions import HTTPException

from core.errors import GatewayError, InvalidRequestError
from core.wire import ErrorBody, ErrorDetail, encoder

_log = structlog.get_logger("switchyard")
_AT = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")
_STATUS_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}

# Deepest JSON nesting a request body may have, the body itself counting as level 1. A chat
# body is ~6 levels deep and real JSON schemas in ``tools`` a dozen or two; 128 is also
# serde_json's default. It must stay far below Python's recursion limit (1000 frames):
# msgspec decodes on the Python stack (Python 3.11), and later passes over the body (vendor
# converters, the response cache, Anthropic cache_control placement) walk it again, deeper.
MAX_JSON_DEPTH = 128
_STRUCTURAL = b'"[]{}'
_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in _STRUCTURAL)
_QUOTE = bytes(1 if b == ord('"') else 0 for b in range(256))
# +1 for an opening bracket, -1 (0xff as int8) for a closing one, 0 for a quote
_STEP = bytes(1 if b in b"[{" else 0xFF if b in b"]}" else 0 for b in range(256))


def error_body(exc: GatewayError) -> bytes:
    detail = ErrorDetail(exc.message, exc.type, exc.param, exc.code)
    return encoder.encode(ErrorBody(detail))


def error_headers(exc: GatewayError, request_id: str | None) -> dict[str, str]:
    """The error's own headers, ``x-request-id`` and ``retry-after`` (whole seconds, at
    least 1). Whoever raises the error bounds its ``retry_after`` (the executor caps an
    upstream's at ``routing.max_client_retry_after_s``); a non-finite one is left out
    rather than crash the error path."""
    headers = dict(exc.headers)
    if request_id:
        headers["x-request-id"] = request_id
    if exc.retry_after is not None and math.isfinite(exc.retry_after):
        headers["retry-after"] = str(max(1, math.ceil(exc.retry_after)))
    return headers


ErrorShape = Callable[[GatewayError, str | None], tuple[int, bytes]]


def openai_shape(exc: GatewayError, request_id: str | None) -> tuple[int, bytes]:
    """(status, body) in OpenAI's ``{"error": {...}}`` shape."""
    return exc.status, error_body(exc)


def render(
    exc: GatewayError, request_id: str | None = None, shape: ErrorShape = openai_shape
) -> Response[bytes]:
    status, body = shape(exc, request_id)
    return Response(
        body,
        status_code=status,
        media_type="application/json",
        headers=error_headers(exc, request_id),
    )


def invalid_body(exc: msgspec.DecodeError | msgspec.ValidationError) -> InvalidRequestError:
    """A 400 for a body that is not JSON, or not the schema, with ``param`` set."""
    if not isinstance(exc, msgspec.ValidationError):
        return InvalidRequestError(
            f"We could not parse the JSON body of your request: {exc}", code="invalid_json"
        )
    text = str(exc)
    match = _AT.search(text)
    path = match.group("path") if match else ""
    message = text[: match.start()] if match else text
    missing = _MISSING.search(message)
    if missing:
        path = f"{path}.{missing.group('field')}" if path else missing.group("field")
    where = f" (at '{path}')" if path else ""
    return InvalidRequestError(f"Invalid request: {message}{where}", param=path or None)


def json_depth_exceeds(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text ``raw`` nests arrays and objects more than ``limit`` levels deep
    (the outermost value is level 1). Exact for valid JSON; for invalid JSON the answer
    does not matter (the decoder refuses it either way).

    Linear and vectorised: a body with at most ``limit`` opening brackets cannot be too
    deep, which settles most requests with two ``count`` calls; otherwise escapes are
    dropped, everything but quotes and brackets is deleted, the quote parity marks what is
    inside strings, and the running sum of +1/-1 over the brackets outside strings is the
    depth."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    # Drop escaped backslashes first, so that in `\\"` the quote is seen as a real quote.
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURAL)
    if text.count(b"[") + text.count(b"{") <= limit:
        return False
    quotes = np.frombuffer(text.translate(_QUOTE), dtype=np.uint8)
    # parity of the quotes so far (a uint8 sum wraps, its parity does not): 0 = outside
    outside = (np.cumsum(quotes, dtype=np.uint8) & 1) ^ 1
    steps = np.frombuffer(text.translate(_STEP), dtype=np.int8) * outside.view(np.int8)
    return bool(np.cumsum(steps, dtype=np.int32).max() > limit)


def too_deep(limit: int = MAX_JSON_DEPTH) -> InvalidRequestError:
    """The 400 for a body nested beyond ``limit`` levels."""
    return InvalidRequestError(
        f"We could not parse the JSON body of your request: JSON nesting deeper than {limit}"
        " levels is not supported.",
        code="json_too_deep",
    )


def decode_body(decoder: msgspec.json.Decoder[Any], raw: bytes) -> Any:
    """``raw`` decoded, or the 400 that says what is wrong with it (not JSON, not the
    schema, or nested deeper than ``MAX_JSON_DEPTH``, checked before decoding)."""
    if json_depth_exceeds(raw):
        raise too_deep()
    try:
        return decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise invalid_body(exc) from exc
    except RecursionError as exc:  # cannot happen within the limit; never a 500 if it does
        raise too_deep() from exc


def _request_id(request: Request[Any, Any, Any]) -> str:
    """The id the handler gave this request, or a fresh one for errors raised before it."""
    value = request.scope.get("state", {}).get("request_id")
    return value if isinstance(value, str) else "req_" + os.urandom(12).hex()


def from_http(exc: HTTPException) -> GatewayError:
    """Litestar's own errors (unknown route, wrong method, body too large) as ours."""
    error = GatewayError(str(exc.detail))
    error.status = exc.status_code
    error.type = _STATUS_TYPES.get(exc.status_code, "invalid_request_error")
    if exc.status_code >= 500:
        error.type = "server_error"
    if exc.status_code == 413:
        error.code = "payload_too_large"
    return error


def internal_error() -> GatewayError:
    return GatewayError("The gateway hit an internal error; it has been logged.")


def exception_handlers(
    shape: ErrorShape = openai_shape, by_prefix: Mapping[str, ErrorShape] | None = None
) -> dict[Any, Any]:
    """Litestar exception handlers that answer every failure in the shape of the path's
    dialect (``by_prefix``: path prefix -> shape, e.g. Anthropic's under ``/v1/messages``;
    ``shape`` elsewhere): the gateway's errors, Litestar's own (also a wrong method on a
    known path), and bugs (logged with their traceback, a plain 500)."""
    prefixes = sorted((by_prefix or {}).items(), key=lambda item: -len(item[0]))

    def shaped(request: Request[Any, Any, Any], error: GatewayError) -> Response[bytes]:
        path = request.url.path
        chosen = next((s for prefix, s in prefixes if path.startswith(prefix)), shape)
        return render(error, _request_id(request), chosen)

    def gateway_error(request: Request[Any, Any, Any], exc: GatewayError) -> Response[bytes]:
        return shaped(request, exc)

    def http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
        return shaped(request, from_http(exc))

    def unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
        _log.exception("request.unhandled_error", path=request.url.path)
        return shaped(request, internal_error())

    return {GatewayError: gateway_error, HTTPException: http_error, Exception: unexpected}
