"""What the OpenAPI document says about each route: ``OPERATIONS``, one ``Operation`` per
(method, path) the app serves, and the shapes of answers that have no wire type of their own
(``gateway.routes.openapi_views``). ``gateway.routes.openapi`` builds the document from them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from core.wire import (
    ChatRequest,
    ChatResponse,
    CompletionRequest,
    EmbeddingRequest,
    EmbeddingResponse,
    ErrorBody,
    ModelCard,
    ModelList,
)
from gateway.dialects.anthropic_messages_body import MessagesBody
from gateway.dialects.anthropic_messages_wire import ErrorOut, MessageOut
from gateway.dialects.responses import ResponsesBody
from gateway.routes.openapi_views import (
    GoodputView,
    Health,
    QuotaView,
    Readiness,
    Reloaded,
    TargetsView,
    TextCompletion,
    TokenCount,
    WebhookDeliveryLog,
)
from policies.jobs.objects import Batch, BatchCreate, BatchList, FileDeleted, FileList, FileObject

OPENAPI_PATH = "/openapi.json"
_JSON = "application/json"
_SSE = "text/event-stream"
_CALL_ERRORS = (400, 401, 403, 404, 413, 429, 502, 503, 504)
# With `stream: true`: one schema per event (the reading OpenAPI 3.2 makes official and
# tools already apply to 3.1 documents), since the stream as a whole is no JSON value.
_SSE_EVENT = {
    "type": "object",
    "description": "One server-sent event. `data` is a JSON chunk (`chat.completion.chunk` "
    "or `text_completion`), an OpenAI-shaped error when the stream fails after its first "
    "byte, or `[DONE]` at the end.",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
    "required": ["data"],
}


# ---------------------------------------------------------------- operations
@dataclass(frozen=True)
class Param:
    """One query, path or header parameter (always a string on the wire)."""

    name: str
    where: Literal["query", "path", "header"]
    description: str
    enum: tuple[str, ...] = ()
    required: bool = False

    def to_openapi(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "string"}
        if self.enum:
            schema["enum"] = list(self.enum)
        return {
            "name": self.name,
            "in": self.where,
            "required": self.required or self.where == "path",
            "description": self.description,
            "schema": schema,
        }


Schema = type | Mapping[str, Any]


@dataclass(frozen=True)
class Operation:
    """What the document says about one (method, path): ``body`` is the JSON request body's
    type (None: no body); ``ok`` maps the success media types to their schema; ``errors``
    are the statuses answered in OpenAI's error shape besides the ``default`` one."""

    summary: str
    tag: str
    auth: Literal["none", "tenant", "admin"]
    ok: Mapping[str, Schema]
    errors: tuple[int, ...] = ()
    body: type | None = None
    params: tuple[Param, ...] = ()
    ok_status: int = 200
    other: Mapping[int, tuple[str, Schema]] | None = None  # non-error-shaped answers
    error: type = ErrorBody  # the route's error shape (Anthropic's on /v1/messages)


_REQUEST_ID = Param(
    "x-request-id", "header", "Your id for this request; echoed in the response header."
)
_USAGE_PARAMS = (
    Param("tenant", "query", "Only this tenant's rows (a tenant key may name its own only)."),
    Param("from", "query", "Start, inclusive: ISO date or datetime (UTC), or Unix seconds."),
    Param("to", "query", "End, exclusive (a date includes that day); same forms as `from`."),
    Param("group_by", "query", "Aggregate rows per day, model or key.", ("day", "model", "key")),
    Param("format", "query", "Export format (default jsonl).", ("csv", "jsonl")),
)
_EXPORT = {"application/x-ndjson": {"type": "string"}, "text/csv": {"type": "string"}}
_FILE_ID = Param("file_id", "path", "A file's id (`file-…`), the caller's own.")
_BATCH_ID = Param("batch_id", "path", "A batch's id (`batch_…`), the caller's own.")
_AFTER = Param("after", "query", "The last id of the previous page (cursor).")
_OBJECT_ERRORS = (401, 404)

OPERATIONS: dict[tuple[str, str], Operation] = {
    ("POST", "/v1/chat/completions"): Operation(
        "Create a chat completion (JSON, or SSE chunks with `stream: true`)",
        "inference",
        "tenant",
        {_JSON: ChatResponse, _SSE: _SSE_EVENT},
        _CALL_ERRORS,
        body=ChatRequest,
        params=(_REQUEST_ID,),
    ),
    ("POST", "/v1/completions"): Operation(
        "Create a legacy text completion (JSON, or SSE with `stream: true`)",
        "inference",
        "tenant",
        {_JSON: TextCompletion, _SSE: _SSE_EVENT},
        _CALL_ERRORS,
        body=CompletionRequest,
        params=(_REQUEST_ID,),
    ),
    ("POST", "/v1/embeddings"): Operation(
        "Create embeddings",
        "inference",
        "tenant",
        {_JSON: EmbeddingResponse},
        _CALL_ERRORS,
        body=EmbeddingRequest,
        params=(_REQUEST_ID,),
    ),
    ("POST", "/v1/messages"): Operation(
        "Create a message in Anthropic's Messages API (JSON, or its SSE events with "
        "`stream: true`); errors in Anthropic's shape",
        "inference",
        "tenant",
        {_JSON: MessageOut, _SSE: {"type": "string"}},
        _CALL_ERRORS,
        body=MessagesBody,
        params=(_REQUEST_ID,),
        error=ErrorOut,
    ),
    ("POST", "/v1/messages/count_tokens"): Operation(
        "Estimate the input tokens of a Messages request (no upstream call)",
        "inference",
        "tenant",
        {_JSON: TokenCount},
        (400, 401, 403, 404),
        body=MessagesBody,
        error=ErrorOut,
    ),
    ("POST", "/v1/responses"): Operation(
        "Create a response in OpenAI's Responses API (JSON, or its SSE events with "
        "`stream: true`); stateless: `previous_response_id` is refused",
        "inference",
        "tenant",
        {_JSON: {"type": "object"}, _SSE: {"type": "string"}},
        _CALL_ERRORS,
        body=ResponsesBody,
        params=(_REQUEST_ID,),
    ),
    ("GET", "/v1/models"): Operation(
        "List the model aliases the caller may use", "models", "tenant", {_JSON: ModelList}, (401,)
    ),
    ("GET", "/v1/models/{model_id}"): Operation(
        "One model alias the caller may use",
        "models",
        "tenant",
        {_JSON: ModelCard},
        (401, 404),
        params=(Param("model_id", "path", "The alias (may contain `/`)."),),
    ),
    ("GET", "/healthz"): Operation("Liveness", "health", "none", {_JSON: Health}),
    ("GET", "/readyz"): Operation(
        "Readiness",
        "health",
        "none",
        {_JSON: Readiness},
        other={503: ("Not ready yet, or startup failed", Readiness)},
    ),
    ("GET", "/metrics"): Operation(
        "Prometheus metrics (docs/metrics.md); admin key only with `require_admin`",
        "health",
        "none",
        {"text/plain": {"type": "string"}},
        (401, 404),
    ),
    ("POST", "/admin/reload"): Operation(
        "Reload the policy file now (the old policy keeps serving when the new one is invalid)",
        "admin",
        "admin",
        {_JSON: Reloaded},
        (400, 401, 403),
    ),
    ("GET", "/admin/targets"): Operation(
        "Targets' breaker state, latency, saturation and cache hit rate; queue depth; workers",
        "admin",
        "admin",
        {_JSON: TargetsView},
        (401, 403),
    ),
    ("GET", "/admin/goodput"): Operation(
        "Requests that met their latency objective, per alias, over the last minute",
        "admin",
        "admin",
        {_JSON: GoodputView},
        (401, 403),
    ),
    ("GET", "/admin/tenants/{tenant}/quota"): Operation(
        "A tenant's (or one key's) current use of each limit, from the shared store",
        "admin",
        "admin",
        {_JSON: QuotaView},
        (401, 403, 404, 503),
        params=(
            Param("tenant", "path", "A configured tenant."),
            Param("key_id", "query", "One of the tenant's keys (its own limits)."),
        ),
    ),
    ("GET", "/admin/webhook_deliveries"): Operation(
        "Batch webhooks' delivery log, newest first: state, attempts, last status or error",
        "admin",
        "admin",
        {_JSON: WebhookDeliveryLog},
        (400, 401, 403),
        params=(
            Param("batch_id", "query", "Only this batch's events."),
            Param("tenant", "query", "Only this tenant's events."),
            Param(
                "state", "query", "Only events in this state.", ("pending", "delivered", "failed")
            ),
            Param("limit", "query", "At most this many, 1 to 1000 (default 100)."),
        ),
    ),
    ("GET", "/admin/usage"): Operation(
        "Every tenant's usage rows (admin key)",
        "usage",
        "admin",
        _EXPORT,
        (400, 401, 403, 503),
        params=_USAGE_PARAMS,
    ),
    ("GET", "/v1/usage"): Operation(
        "The calling key's tenant's usage rows",
        "usage",
        "tenant",
        _EXPORT,
        (400, 401, 403, 503),
        params=_USAGE_PARAMS,
    ),
    ("POST", "/v1/files"): Operation(
        "Upload a batch input file: multipart/form-data with `file` (JSON Lines, one request "
        "a line) and `purpose=batch`; every line is checked, a 400 names the bad ones",
        "batch",
        "tenant",
        {_JSON: FileObject},
        (400, 401, 413),
    ),
    ("GET", "/v1/files"): Operation(
        "The caller's files (uploads and batch results), newest first",
        "batch",
        "tenant",
        {_JSON: FileList},
        (400, 401),
        params=(
            _AFTER,
            Param("limit", "query", "Page size, 1 to 10000 (default 10000)."),
            Param("order", "query", "By creation time (default desc).", ("asc", "desc")),
            Param("purpose", "query", "Only files with this purpose (batch, batch_output)."),
        ),
    ),
    ("GET", "/v1/files/{file_id}"): Operation(
        "One of the caller's files",
        "batch",
        "tenant",
        {_JSON: FileObject},
        _OBJECT_ERRORS,
        params=(_FILE_ID,),
    ),
    ("DELETE", "/v1/files/{file_id}"): Operation(
        "Delete one of the caller's files",
        "batch",
        "tenant",
        {_JSON: FileDeleted},
        _OBJECT_ERRORS,
        params=(_FILE_ID,),
    ),
    ("GET", "/v1/files/{file_id}/content"): Operation(
        "A file's bytes (a batch's output or error file: JSON Lines)",
        "batch",
        "tenant",
        {"application/octet-stream": {"type": "string"}},
        _OBJECT_ERRORS,
        params=(_FILE_ID,),
    ),
    ("POST", "/v1/batches"): Operation(
        "Create a batch from an uploaded file; it starts `validating`",
        "batch",
        "tenant",
        {_JSON: Batch},
        (400, 401, 404),
        body=BatchCreate,
    ),
    ("GET", "/v1/batches"): Operation(
        "The caller's batches, newest first",
        "batch",
        "tenant",
        {_JSON: BatchList},
        (400, 401),
        params=(_AFTER, Param("limit", "query", "Page size, 1 to 100 (default 20).")),
    ),
    ("GET", "/v1/batches/{batch_id}"): Operation(
        "One of the caller's batches: status, request counts, output and error files",
        "batch",
        "tenant",
        {_JSON: Batch},
        _OBJECT_ERRORS,
        params=(_BATCH_ID,),
    ),
    ("POST", "/v1/batches/{batch_id}/cancel"): Operation(
        "Cancel a batch: pending requests are dropped, running ones finish (`cancelling`, "
        "then `cancelled`); 409 for a batch that already ended",
        "batch",
        "tenant",
        {_JSON: Batch},
        (401, 404, 409),
        params=(_BATCH_ID,),
    ),
    ("GET", OPENAPI_PATH): Operation("This document", "meta", "none", {_JSON: {"type": "object"}}),
}
