"""Reading a batch input file: one request per line, every problem reported with its line.

A line is ``{"custom_id": str, "method": "POST", "url": <endpoint>, "body": {...}}``.
Checks, per line and in this order (the first that fails is the line's error):

- ``invalid_json_line``: not a JSON object;
- ``missing_required_parameter`` (``param`` names it): no ``custom_id``, ``method``,
  ``url`` or ``body``, or an empty ``custom_id``, or a body without ``model``;
- ``invalid_value``: a field of the wrong type, or a ``custom_id`` holding a NUL;
- ``duplicate_custom_id``: the ``custom_id`` of an earlier line;
- ``invalid_method``: a method other than POST;
- ``invalid_url``: an endpoint batches cannot use, or not the batch's ``endpoint``;
- ``invalid_request``: ``"stream": true`` (a batch answer is one JSON document);
- whatever ``check`` says about the body (the gateway passes one that knows the model
  aliases and the endpoint's schema: ``model_not_found``, ``model_not_allowed``,
  ``invalid_request``).

Blank lines are skipped (line numbers still count them); ``\\r\\n`` endings are fine. At most
``MAX_ERRORS`` errors are kept (a file of 50,000 bad lines must not make a 50,000-entry
answer). The body is kept as the exact bytes the client wrote, to be forwarded as is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from msgspec import Struct

from policies.jobs.objects import ENDPOINTS, BatchError

MAX_ERRORS = 100
_line_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])
_body_decoder = msgspec.json.Decoder(dict[str, Any])


class Request(Struct, frozen=True, kw_only=True):
    """One valid line."""

    line: int
    custom_id: str
    url: str
    model: str
    body: bytes


class Problem(Struct, frozen=True):
    """What ``check`` reports about a body: an error ``code``, its ``message`` and the
    field (``param``, as a path inside the body, e.g. ``messages[0].role``)."""

    code: str
    message: str
    param: str | None = None


# check(url, model, body bytes) -> a problem, or None when the body is fine
BodyCheck = Callable[[str, str, bytes], Problem | None]


class _Bad(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.error = (code, message, param)


def parse_jsonl(
    content: bytes,
    *,
    endpoint: str | None = None,
    check: BodyCheck | None = None,
    max_requests: int = 50_000,
) -> tuple[list[Request], list[BatchError]]:
    """The file's requests and its errors (a file with any error must not run).
    ``endpoint``: the batch's (each line's ``url`` must equal it); None at upload, when
    any endpoint batches can use is accepted."""
    requests: list[Request] = []
    errors: list[BatchError] = []
    seen: set[str] = set()
    for number, raw_line in enumerate(content.split(b"\n"), start=1):
        text = raw_line.rstrip(b"\r")
        if not text.strip():
            continue
        try:
            request = _parse_line(number, text, endpoint, seen)
            if check is not None:
                _check_body(request, check)
        except _Bad as bad:
            code, message, param = bad.error
            if len(errors) < MAX_ERRORS:
                errors.append(BatchError(code=code, message=message, param=param, line=number))
            continue
        requests.append(request)
    count = len(requests) + len(errors)
    if count > max_requests:
        message = f"The file has {count} requests; a batch may hold at most {max_requests}."
        errors.insert(0, BatchError(code="too_many_requests", message=message))
    elif count == 0:
        errors.append(BatchError(code="empty_file", message="The file holds no requests."))
    return requests, errors[:MAX_ERRORS]


def _parse_line(number: int, text: bytes, endpoint: str | None, seen: set[str]) -> Request:
    try:
        fields = _line_decoder.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _Bad("invalid_json_line", "This line is not parseable as a JSON object.") from exc
    custom_id = _string(fields, "custom_id")
    if "\x00" in custom_id:  # no database text holds NUL (Postgres refuses it)
        raise _Bad("invalid_value", "'custom_id' must not contain NUL characters.", "custom_id")
    if custom_id in seen:
        raise _Bad(
            "duplicate_custom_id",
            f"The custom_id '{custom_id}' is used by an earlier line; each request in a batch "
            "needs its own.",
            "custom_id",
        )
    seen.add(custom_id)  # an id is taken by its first line, valid or not
    method = _string(fields, "method")
    if method.upper() != "POST":
        raise _Bad("invalid_method", f"Method '{method}' is not supported; use POST.", "method")
    url = _string(fields, "url")
    if url not in ENDPOINTS:
        supported = ", ".join(ENDPOINTS)
        raise _Bad("invalid_url", f"URL '{url}' cannot be batched (use {supported}).", "url")
    if endpoint is not None and url != endpoint:
        raise _Bad(
            "invalid_url",
            f"The URL '{url}' does not match the batch's endpoint '{endpoint}'.",
            "url",
        )
    body = _body(fields)
    return Request(line=number, custom_id=custom_id, url=url, model=body[0], body=body[1])


def _string(fields: dict[str, msgspec.Raw], name: str) -> str:
    raw = fields.get(name)
    if raw is None:
        raise _Bad("missing_required_parameter", f"Missing required parameter: '{name}'.", name)
    try:
        value = msgspec.json.decode(raw, type=str)
    except msgspec.ValidationError as exc:
        raise _Bad("invalid_value", f"'{name}' must be a string.", name) from exc
    if not value:
        raise _Bad("missing_required_parameter", f"'{name}' must not be empty.", name)
    return value


def _body(fields: dict[str, msgspec.Raw]) -> tuple[str, bytes]:
    """(model, the body's exact bytes)."""
    raw = fields.get("body")
    if raw is None:
        raise _Bad("missing_required_parameter", "Missing required parameter: 'body'.", "body")
    text = bytes(raw)
    try:
        body = _body_decoder.decode(text)
    except msgspec.ValidationError as exc:
        raise _Bad("invalid_value", "'body' must be a JSON object.", "body") from exc
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _Bad(
            "missing_required_parameter", "Missing required parameter: 'body.model'.", "body.model"
        )
    if body.get("stream") is True:
        raise _Bad("invalid_request", "Batch requests cannot stream; drop 'stream'.", "body.stream")
    return model, text


def _check_body(request: Request, check: BodyCheck) -> None:
    problem = check(request.url, request.model, request.body)
    if problem is not None:
        param = f"body.{problem.param}" if problem.param else None
        raise _Bad(problem.code, problem.message, param)


def describe(errors: list[BatchError], limit: int = 10) -> str:
    """The first ``limit`` errors as one message: ``Line 3: ... Line 7: ...``."""
    parts = [
        (f"Line {error.line}: " if error.line is not None else "") + error.message
        for error in errors[:limit]
    ]
    more = f" (and {len(errors) - limit} more)" if len(errors) > limit else ""
    return " ".join(parts) + more
