"""The gateway's OpenAPI 3.1 document, served at ``GET /openapi.json``.

The handlers take the raw request and decode bodies themselves with msgspec, so a schema
that Litestar generates from their signatures would say nothing about bodies. This module
writes the document from the msgspec wire types instead (``core/wire.py``), one operation
per route the app registers, and ``publish`` encodes it once per app: the route answers the
same cached bytes every time and needs no credentials (the document holds no secrets).

What the document says about each route is ``openapi_operations.OPERATIONS``; this module
builds the document from it. Every route of the app appears in the document (but the admin
console's HTML pages, marked ``include_in_schema=False``). One that has
no entry in ``OPERATIONS`` still appears, with a generic operation marked
``x-switchyard-undocumented`` (so a new route cannot silently vanish from the document, and
the unit test names it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, get
from litestar.routes import HTTPRoute

from core.wire import ErrorBody
from gateway.routes.admin_keys_openapi import CONTROL_OPERATIONS
from gateway.routes.openapi_operations import (
    OPENAPI_PATH,
    OPERATIONS,
    Operation,
    Param,
    Schema,
)

UNDOCUMENTED = "x-switchyard-undocumented"
_STATE_KEY = "openapi_document"
_REF = "#/components/schemas/{name}"
_JSON = "application/json"
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
        if not isinstance(route, HTTPRoute) or not _in_schema(route):
            continue
        path = openapi_path(route.path)
        found.extend((m, path) for m in sorted(route.methods - _IMPLICIT_METHODS))
    return found


def _in_schema(route: HTTPRoute) -> bool:
    """False for routes marked ``include_in_schema=False`` (the admin console's pages)."""
    return any(handler.resolve_include_in_schema() for handler in route.route_handlers)


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
    described = {**OPERATIONS, **CONTROL_OPERATIONS}
    chosen = [(m, p, described.get((m, p))) for m, p in routes]
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
