"""The control plane's admin API for API keys (admin key only): create (the secret is in
that one answer and never again), list, read, change, rotate, revoke; the audit log; the
replica's view of the store. docs/keys.md is the operator's guide.

Every change is committed to the control store with its audit record (actor: the admin
principal's id, ``admin`` for the admin key), then this replica reloads its index at once;
the other replicas follow within a poll. Errors in OpenAI's shape: 400 (bad body, unknown
model alias, expiry in the past, a limit that is not a positive number; ``param`` names the
field), 401/403 (not the admin key), 404 (unknown key or tenant), 409 (a revoked key), 503
(the store is unreachable; nothing changed).
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, get, patch, post

from core.errors import InvalidRequestError
from core.tenancy import Principal
from gateway.http.errors import decode_body
from gateway.http.guard import require_admin
from gateway.process.control import GatewayControl
from gateway.process.state import GatewayState
from policies.control import Catalog, CreateKey, KeyRecord, RotateKey, UpdateKey, public_view

PATH = "/admin/keys"
MAX_AUDIT = 1000
_JSON = "application/json"
_NO_STORE = {"cache-control": "no-store"}
_create = msgspec.json.Decoder(CreateKey)
_update = msgspec.json.Decoder(UpdateKey)
_rotate = msgspec.json.Decoder(RotateKey)


class Admin:
    """What one admin request works with: the gateway, its control plane, the actor."""

    def __init__(self, request: Request[Any, Any, Any]) -> None:
        principal: Principal = require_admin(request)
        self.state: GatewayState = request.app.state.gateway
        control = self.state.control
        if control is None:
            raise InvalidRequestError(
                "This gateway has no control plane: add a `control:` section to its policy "
                "file (docs/keys.md).",
                code="control_plane_disabled",
            )
        self.control: GatewayControl = control
        self.actor = principal.key_id or "admin"

    @property
    def catalog(self) -> Catalog:
        return self.control.catalog(self.state.runtime.config)

    def now(self) -> float:
        return self.state.clock.wall()

    def view(self, record: KeyRecord, secret: str | None = None) -> dict[str, Any]:
        shown = public_view(record, self.now())
        if secret is not None:
            shown["key"] = secret  # the only time it is ever shown
        return shown


def answer(body: Any, status: int = 200) -> Response[bytes]:
    return Response(
        msgspec.json.encode(body), status_code=status, media_type=_JSON, headers=_NO_STORE
    )


async def body_of(request: Request[Any, Any, Any], decoder: msgspec.json.Decoder[Any]) -> Any:
    """The decoded JSON body (400 naming the field); an empty body reads as ``{}``."""
    raw = await request.body()
    return decode_body(decoder, raw if raw.strip() else b"{}")


@post(PATH, status_code=201)
async def create_key(request: Request[Any, Any, Any]) -> Response[bytes]:
    """A new key for a tenant; its secret is in this answer only (``key``)."""
    admin = Admin(request)
    body: CreateKey = await body_of(request, _create)
    secret, record = await admin.control.plane.create_key(body, admin.catalog, admin.actor)
    await admin.control.changed()
    return answer(admin.view(record, secret), 201)


@get(PATH)
async def list_keys(request: Request[Any, Any, Any], tenant: str | None = None) -> Response[bytes]:
    """Every key (revoked and expired ones too), oldest first; ``?tenant=`` narrows."""
    admin = Admin(request)
    records = await admin.control.plane.list_keys(tenant or None)
    return answer({"object": "list", "data": [admin.view(r) for r in records]})


@get(PATH + "/{key_id:str}")
async def get_key(request: Request[Any, Any, Any], key_id: str) -> Response[bytes]:
    admin = Admin(request)
    return answer(admin.view(await admin.control.plane.get_key(key_id)))


@patch(PATH + "/{key_id:str}")
async def update_key(request: Request[Any, Any, Any], key_id: str) -> Response[bytes]:
    """Change ``name``, ``allowed_models``, ``expires_at``, ``metadata`` or ``limits``."""
    admin = Admin(request)
    body: UpdateKey = await body_of(request, _update)
    record = await admin.control.plane.update_key(key_id, body, admin.catalog, admin.actor)
    await admin.control.changed()
    return answer(admin.view(record))


@post(PATH + "/{key_id:str}/rotate", status_code=200)
async def rotate_key(request: Request[Any, Any, Any], key_id: str) -> Response[bytes]:
    """A new secret (in this answer only); the old one works ``grace_seconds`` more."""
    admin = Admin(request)
    body: RotateKey = await body_of(request, _rotate)
    secret, record = await admin.control.plane.rotate_key(key_id, body, admin.actor)
    await admin.control.changed()
    return answer(admin.view(record, secret))


@post(PATH + "/{key_id:str}/revoke", status_code=200)
async def revoke_key(request: Request[Any, Any, Any], key_id: str) -> Response[bytes]:
    admin = Admin(request)
    record = await admin.control.plane.revoke_key(key_id, admin.actor)
    await admin.control.changed()
    return answer(admin.view(record))


@get("/admin/audit")
async def audit_log(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Admin actions, newest first. ``limit`` 1 to 1000 (default 100), ``before`` (an id:
    the next page), ``target`` (a key id or tenant), ``action`` (e.g. ``key.revoke``)."""
    admin = Admin(request)
    params = request.query_params
    limit = _int_param(params.get("limit"), "limit", 100, 1, MAX_AUDIT) or 100
    before = _int_param(params.get("before"), "before", None, 1, None)
    records = await admin.control.store.audit(
        limit=limit,
        before=before,
        target=params.get("target") or None,
        action=params.get("action") or None,
    )
    has_more = len(records) == limit
    return answer({"object": "list", "data": records, "has_more": has_more})


@get("/admin/control")
async def control_status(request: Request[Any, Any, Any]) -> Response[bytes]:
    """This replica's view of the control store: the version loaded, how many keys and API
    tenants, polls, reloads, failed polls and the last error (None when the last poll
    worked), and when the index was last loaded."""
    admin = Admin(request)
    stats = admin.control.refresher.stats
    index = admin.control.index
    body = {
        "backend": admin.control.store.db.name,
        "version": index.version,
        "keys": len(index),
        "tenants": sorted(index.tenants),
        "poll_interval_s": admin.control.refresher.poll_interval_s,
        "polls": stats.polls,
        "reloads": stats.reloads,
        "failures": stats.failures,
        "last_error": stats.last_error,
        "loaded_at": stats.loaded_at,
    }
    return answer(body)


def _int_param(
    raw: str | None, name: str, default: int | None, low: int, high: int | None
) -> int | None:
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if value < low or (high is not None and value > high):
        span = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise InvalidRequestError(
            f"{name} must be an integer {span}.", param=name, code="invalid_value"
        )
    return value
