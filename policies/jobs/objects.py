"""The Files and Batch APIs' wire shapes, exactly as OpenAI writes them (and as the official
``openai`` SDK reads them: ``openai.types.FileObject``, ``Batch``, ``FileDeleted``, the
cursor pages), plus the lines of a batch's output and error files.

Every field is written, ``null`` included, as OpenAI does; ``kw_only`` keeps the field
order of OpenAI's own JSON."""

from __future__ import annotations

import secrets
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

# The endpoints a batch may target (OpenAI also batches moderations and images; this
# gateway serves neither).
ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/completions", "/v1/responses")
FILE_PURPOSE = "batch"  # the only purpose clients upload here
OUTPUT_PURPOSE = "batch_output"  # output and error files
BatchStatus = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
MetadataKey = Annotated[str, Meta(max_length=64)]
MetadataValue = Annotated[str, Meta(max_length=512)]
Metadata = Annotated[dict[MetadataKey, MetadataValue], Meta(max_length=16)]


def new_id(prefix: str) -> str:
    """``file-…``, ``batch_…``, ``batch_req_…``: 96 random bits, never reused."""
    return prefix + secrets.token_hex(12)


class FileObject(Struct, kw_only=True):
    """``POST /v1/files``, ``GET /v1/files/{id}``: an uploaded (or output) file."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileDeleted(Struct, kw_only=True):
    """``DELETE /v1/files/{id}``."""

    id: str
    object: Literal["file"] = "file"
    deleted: bool


class BatchError(Struct, kw_only=True):
    """One problem with a batch's input file: ``line`` is 1-based, ``param`` the field."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(Struct, kw_only=True):
    total: int = 0
    completed: int = 0
    failed: int = 0


class InputTokensDetails(Struct, kw_only=True):
    cached_tokens: int = 0


class OutputTokensDetails(Struct, kw_only=True):
    reasoning_tokens: int = 0


class BatchUsage(Struct, kw_only=True):
    """The tokens of the batch's answered requests so far (OpenAI's ``Batch.usage``)."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class Batch(Struct, kw_only=True):
    """``POST /v1/batches``, ``GET /v1/batches/{id}``: a batch and where it stands."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    metadata: dict[str, str] | None = None
    model: str | None = None  # the alias of its requests (the first answered one's)
    usage: BatchUsage | None = None


class FileList(Struct, kw_only=True):
    """``GET /v1/files``: a cursor page (``after`` = the last id of the previous page)."""

    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class BatchList(Struct, kw_only=True):
    """``GET /v1/batches``: a cursor page, newest first."""

    object: Literal["list"] = "list"
    data: list[Batch]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class ExpiresAfter(Struct, kw_only=True):
    """When a file expires: ``seconds`` after its creation (OpenAI: 1 hour to 30 days)."""

    anchor: Literal["created_at"]
    seconds: Annotated[int, Meta(ge=3600, le=2_592_000)]


class BatchCreate(Struct, kw_only=True):
    """``POST /v1/batches``'s body."""

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: Metadata | None = None
    output_expires_after: ExpiresAfter | None = None


# ---------------------------------------------------------------- output and error lines
class OutputResponse(Struct, kw_only=True):
    status_code: int
    request_id: str
    body: msgspec.Raw  # the endpoint's JSON answer, as it was written (on one line)


class OutputError(Struct, kw_only=True):
    code: str
    message: str


class OutputLine(Struct, kw_only=True):
    """One line of an output or error file: an answer (``response``), or why the request
    never ran (``error``: ``batch_expired``, ``batch_cancelled``)."""

    id: str
    custom_id: str
    response: OutputResponse | None = None
    error: OutputError | None = None


DROPPED = {
    "cancelled": OutputError(
        code="batch_cancelled",
        message="This request was not executed because the batch was cancelled.",
    ),
    "expired": OutputError(
        code="batch_expired",
        message="This request could not be executed before the completion window expired.",
    ),
}
_encode = msgspec.json.Encoder().encode


def answered_line(custom_id: str, status: int, request_id: str, body: bytes) -> bytes:
    """The output line of a request that got an answer. ``body`` is kept as written when
    it is JSON on one line, re-encoded when it spans several (a JSONL record is one line),
    and wrapped in OpenAI's error shape when it is not JSON at all."""
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError:
        text = body.decode("utf-8", errors="replace")
        value = {"error": {"message": text, "type": "server_error", "param": None, "code": None}}
        body = b"\n"  # never kept as it is
    raw = body if b"\n" not in body and b"\r" not in body else _encode(value)
    response = OutputResponse(status_code=status, request_id=request_id, body=msgspec.Raw(raw))
    return _encode(OutputLine(id=new_id("batch_req_"), custom_id=custom_id, response=response))


def error_line(custom_id: str, code: str, message: str) -> bytes:
    """The error line of a request that got no answer, for the reason given (a provider's
    batch that did not run it)."""
    error = OutputError(code=code, message=message)
    return _encode(OutputLine(id=new_id("batch_req_"), custom_id=custom_id, error=error))


def dropped_line(custom_id: str, why: Literal["cancelled", "expired"]) -> bytes:
    """The error line of a request that never ran."""
    return _encode(OutputLine(id=new_id("batch_req_"), custom_id=custom_id, error=DROPPED[why]))
