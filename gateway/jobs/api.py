"""What the Files and Batch routes share: the runner and its store, JSON answers, the
multipart upload, cursor-page parameters. Every bad value is a 400 naming its parameter,
in OpenAI's error shape."""

from __future__ import annotations

import asyncio
from typing import Any, Literal, NamedTuple, cast

import msgspec
from litestar import Request, Response
from litestar.datastructures import UploadFile

from core.errors import InvalidRequestError, PayloadTooLargeError
from core.tenancy import Principal
from gateway.jobs.runner import BatchRunner
from gateway.jobs.validate import body_check
from gateway.process.runtime import Runtime
from policies.jobs.jsonl import describe, parse_jsonl
from policies.jobs.objects import FILE_PURPOSE, ExpiresAfter

_JSON = "application/json"
_encode = msgspec.json.Encoder().encode
MAX_FILENAME = 512
MULTIPART_SLACK = 64 * 1024  # form fields and part headers around the file's bytes


def runner_of(request: Request[Any, Any, Any]) -> BatchRunner:
    runner: BatchRunner = request.app.state.jobs
    return runner


def answer(obj: Any) -> Response[bytes]:
    """``obj`` (a wire Struct) as a 200 JSON answer."""
    return Response(_encode(obj), media_type=_JSON, headers={"cache-control": "no-store"})


class Upload(NamedTuple):
    filename: str
    content: bytes
    expires_after_s: int | None


async def read_upload(request: Request[Any, Any, Any], max_bytes: int) -> Upload:
    """The ``file`` and ``purpose`` fields of a multipart upload (and ``expires_after``,
    as the SDK flattens it). Only purpose ``batch`` is accepted: this gateway stores
    files for batches and for nothing else."""
    form = await request.form()
    purpose = form.get("purpose")
    if not isinstance(purpose, str) or not purpose:
        raise _missing("purpose")
    if purpose != FILE_PURPOSE:
        raise InvalidRequestError(
            f"Invalid purpose '{purpose[:64]}': this gateway accepts files for 'batch' only.",
            param="purpose",
            code="invalid_value",
        )
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise _missing("file")
    content = await upload.read()
    if len(content) > max_bytes:
        raise PayloadTooLargeError(
            f"The file has {len(content)} bytes; the most this gateway takes is {max_bytes}.",
            param="file",
        )
    filename = (upload.filename or "upload.jsonl")[:MAX_FILENAME]
    return Upload(filename, content, _expires_after(form))


def _expires_after(form: Any) -> int | None:
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    try:
        return msgspec.convert(
            {"anchor": anchor, "seconds": int(seconds)}, ExpiresAfter, strict=False
        ).seconds
    except (TypeError, ValueError, msgspec.ValidationError) as exc:
        raise InvalidRequestError(
            "expires_after needs anchor 'created_at' and seconds from 3600 to 2592000.",
            param="expires_after",
        ) from exc


def _missing(name: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Missing required parameter: '{name}'.", param=name, code="missing_required_parameter"
    )


async def check_upload(runtime: Runtime, principal: Principal, content: bytes) -> None:
    """400 listing the first bad lines (with their numbers) of a batch input file."""
    check = body_check(runtime, principal)
    limit = runtime.config.batch.max_requests
    # Off the event loop: a large file takes a moment to read line by line.
    _, errors = await asyncio.to_thread(parse_jsonl, content, check=check, max_requests=limit)
    if errors:
        raise InvalidRequestError(
            f"The file is not a valid batch input file: {describe(errors)}",
            param="file",
            code="invalid_file",
        )


def page_params(
    request: Request[Any, Any, Any], *, default: int, maximum: int
) -> tuple[str | None, int]:
    """``after`` and ``limit`` (1 to ``maximum``) of a list request."""
    params = request.query_params
    raw = params.get("limit")
    try:
        limit = default if raw is None else int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= maximum:
        raise InvalidRequestError(
            f"limit must be an integer from 1 to {maximum}.", param="limit", code="invalid_value"
        )
    return params.get("after") or None, limit


def order_param(request: Request[Any, Any, Any]) -> Literal["asc", "desc"]:
    order = request.query_params.get("order") or "desc"
    if order not in ("asc", "desc"):
        raise InvalidRequestError("order must be 'asc' or 'desc'.", param="order")
    return cast(Literal["asc", "desc"], order)


def unknown_cursor(after: str) -> InvalidRequestError:
    return InvalidRequestError(f"No object with id '{after}' to list after.", param="after")
