"""The gateway's OpenAPI 3.1 document, served at ``GET /openapi.json``.

The handlers take the raw request and decode bodies themselves with msgspec, so a schema
that Litestar generates from their signatures would say nothing about bodies. This module
writes the document from the msgspec wire types instead (``core/wire.py``), one operation
per route the app registers, and ``publish`` encodes it once per app: the route answers the
same cached bytes every time and needs no credentials (the document holds no secrets).

Every route of the app appears in the document. One that has no entry in ``OPERATIONS``
still appears, with a generic operation marked ``x-switchyard-undocumented`` (so a new
route cannot silently vanish from the document, and the unit test names it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from litestar import Litestar, Request, Response, get
from litestar.routes import HTTPRoute

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
from gateway.dialects.anthropic_messages import MessagesBody
from gateway.dialects.anthropic_messages_encode import ErrorOut, MessageOut
from gateway.dialects.responses import ResponsesBody

OPENAPI_PATH = "/openapi.json"
UNDOCUMENTED = "x-switchyard-undocumented"
_STATE_KEY = "openapi_document"
_REF = "#/components/schemas/{name}"
_JSON = "application/json"
_SSE = "text/event-stream"
# Litestar answers these on every route by itself; they are not part of the API.
_IMPLICIT_METHODS = frozenset({"HEAD", "OPTIONS"})
_ERROR_TEXT = {
    400: "Malformed JSON, a schema violation (`param` names the field) or a bad value",
    401: "Missing, unknown, revoked or invalid credentials",
    403: "The credentials may not use this model or route",
    404: "Unknown model alias",
    413: "The body is larger than `server.max_body_bytes`",
    429: "A tenant quota or the admission queue is full (see `Retry-After`)",
    502: "Every target failed",
    503: "No usable target, shared state unreachable (fail closed), or draining",
    504: "The upstream timed out",
}
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


# ---------------------------------------------------------------- documentation-only shapes
class Health(msgspec.Struct):
    """``GET /healthz``: the process answers."""

    status: Literal["ok"]


class Readiness(msgspec.Struct, omit_defaults=True):
    """``GET /readyz``: 200 once every enabled provider is ready, else 503 with this body."""

    status: Literal["ready", "starting", "failed"]
    providers: dict[str, bool]
    disabled: dict[str, str]
    error: str | None = None


class Reloaded(msgspec.Struct):
    """``POST /admin/reload``: the aliases the new policy serves."""

    status: Literal["reloaded"]
    models: list[str]


class TargetsView(msgspec.Struct):
    """``GET /admin/targets``: each target's health, skipped targets, the queue's depth."""

    targets: list[dict[str, Any]]
    skipped: dict[str, list[dict[str, Any]]]
    queue: dict[str, Any]


class QuotaView(msgspec.Struct):
    """``GET /admin/tenants/{tenant}/quota``: the current use of each limit."""

    tenant: str
    key_id: str | None
    limits: dict[str, Any]


class TokenCount(msgspec.Struct):
    """``POST /v1/messages/count_tokens``: the estimate quotas reserve."""

    input_tokens: int


class TextCompletion(msgspec.Struct):
    """A legacy completion as the upstream answered it (forwarded as is)."""

    choices: list[dict[str, Any]]
    object: str = "text_completion"


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
    ("POST", "/admin/reload"): Operation(
        "Reload the policy file now (the old policy keeps serving when the new one is invalid)",
        "admin",
        "admin",
        {_JSON: Reloaded},
        (400, 401, 403),
    ),
    ("GET", "/admin/targets"): Operation(
        "Targets' breaker state, latency, saturation and cache hit rate; queue depth",
        "admin",
        "admin",
        {_JSON: TargetsView},
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
    ("GET", OPENAPI_PATH): Operation("This document", "meta", "none", {_JSON: {"type": "object"}}),
}

_SECURITY_SCHEMES = {
    "bearerAuth": {
        "type": "http",
        "scheme": "bearer",
        "description": "A tenant's API key (`switchyard keys create`), a JWT from the "
        "configured identity provider, or the admin key. A gateway without tenants is open.",
    },
    "apiKeyAuth": {
        "type": "apiKey",
        "in": "header",
        "name": "x-api-key",
        "description": "The same credentials, for Anthropic-style clients.",
    },
}
_CREDENTIALS: list[dict[str, list[str]]] = [{"bearerAuth": []}, {"apiKeyAuth": []}]


# ---------------------------------------------------------------- building the document
def openapi_path(litestar_path: str) -> str:
    """A Litestar route path in OpenAPI's form: ``/v1/models/{model_id:path}`` ->
    ``/v1/models/{model_id}``."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", litestar_path)


def app_routes(app: Litestar) -> list[tuple[str, str]]:
    """Every (method, OpenAPI path) the app serves, in registration order, without the
    methods Litestar adds to each route by itself."""
    found: list[tuple[str, str]] = []
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        path = openapi_path(route.path)
        found.extend((m, path) for m in sorted(route.methods - _IMPLICIT_METHODS))
    return found


def _types_of(operations: Iterable[Operation]) -> list[type]:
    """The msgspec types the operations name, each once, ``ErrorBody`` first."""
    seen: dict[type, None] = {ErrorBody: None}
    for op in operations:
        schemas: list[Schema] = list(op.ok.values())
        schemas += [schema for _, schema in (op.other or {}).values()]
        if op.body is not None:
            schemas.append(op.body)
        schemas.append(op.error)
        seen.update((s, None) for s in schemas if isinstance(s, type))
    return list(seen)


def _schema(schema: Schema, refs: Mapping[type, dict[str, Any]]) -> dict[str, Any]:
    return dict(refs[schema]) if isinstance(schema, type) else dict(schema)


def _responses(op: Operation, refs: Mapping[type, dict[str, Any]]) -> dict[str, Any]:
    ok = {media: {"schema": _schema(s, refs)} for media, s in op.ok.items()}
    answers: dict[str, Any] = {str(op.ok_status): {"description": op.summary, "content": ok}}
    for status, (text, schema) in (op.other or {}).items():
        answers[str(status)] = {
            "description": text,
            "content": {_JSON: {"schema": _schema(schema, refs)}},
        }
    for status in op.errors:
        answers[str(status)] = {
            "description": _ERROR_TEXT.get(status, "Error"),
            "content": {_JSON: {"schema": dict(refs[op.error])}},
        }
    # Anything else (a wrong method, an internal error) is in the route's error shape too.
    if op.error is ErrorBody:
        answers["default"] = {"$ref": "#/components/responses/Error"}
    else:
        answers["default"] = {
            "description": "An error in this route's shape",
            "content": {_JSON: {"schema": dict(refs[op.error])}},
        }
    return answers


def _operation(method: str, path: str, op: Operation, refs: Mapping[type, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "operationId": f"{method.lower()}_{re.sub(r'[^a-z0-9]+', '_', path.lower()).strip('_')}",
        "summary": op.summary,
        "tags": [op.tag],
        "security": [] if op.auth == "none" else list(_CREDENTIALS),
        "responses": _responses(op, refs),
    }
    if op.auth == "admin":
        doc["description"] = "Needs the admin key (`auth.admin_key_env`)."
    if op.params:
        doc["parameters"] = [p.to_openapi() for p in op.params]
    if op.body is not None:
        doc["requestBody"] = {
            "required": True,
            "content": {_JSON: {"schema": dict(refs[op.body])}},
        }
    return doc


def _undocumented(path: str) -> Operation:
    """A route nobody described yet: any answer, in OpenAI's error shape when it fails."""
    params = tuple(Param(name, "path", name) for name in re.findall(r"\{(\w+)\}", path))
    return Operation("Undocumented route", "undocumented", "tenant", {_JSON: {}}, params=params)


def _require_every_field(component: dict[str, Any]) -> None:
    """Mark every property required: the gateway always encodes ``ErrorDetail``'s four keys
    (null when empty), though msgspec only lists the fields that have no default."""
    component["required"] = sorted(component["properties"])


def build_document(routes: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """The OpenAPI 3.1 document for ``routes`` ((method, OpenAPI path) pairs): request
    bodies and answers from the msgspec wire types, every error as ``ErrorBody``."""
    chosen = [(m, p, OPERATIONS.get((m, p))) for m, p in routes]
    ops = [(m, p, op or _undocumented(p)) for m, p, op in chosen]
    types = _types_of(op for _, _, op in ops)
    refs_list, components = msgspec.json.schema_components(types, ref_template=_REF)
    refs = dict(zip(types, refs_list, strict=True))
    _require_every_field(components["ErrorDetail"])
    paths: dict[str, dict[str, Any]] = {}
    for (method, path, op), (_, _, known) in zip(ops, chosen, strict=True):
        entry = _operation(method, path, op, refs)
        if known is None:
            entry[UNDOCUMENTED] = True
        paths.setdefault(path, {})[method.lower()] = entry
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Switchyard",
            "version": "1.0",
            "description": "An OpenAI-compatible LLM gateway. Errors are OpenAI-shaped: "
            '{"error": {"message", "type", "param", "code"}}.',
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "responses": {
                "Error": {
                    "description": "An error in OpenAI's shape",
                    "content": {_JSON: {"schema": dict(refs[ErrorBody])}},
                }
            },
            "securitySchemes": _SECURITY_SCHEMES,
        },
    }


def publish(app: Litestar) -> None:
    """Build ``app``'s document once and keep its bytes for ``GET /openapi.json``."""
    app.state[_STATE_KEY] = msgspec.json.encode(build_document(app_routes(app)))


@get(OPENAPI_PATH)
async def openapi_document(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The document ``publish`` built for this app (no credentials needed)."""
    body: bytes = request.app.state[_STATE_KEY]
    return Response(body, media_type=_JSON)
