"""What the OpenAPI document says about the control plane's admin routes
(``admin_keys``, ``admin_tenants``); ``gateway.routes.openapi`` reads ``CONTROL_OPERATIONS``
next to ``openapi_operations.OPERATIONS``."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from core.config_tenants import Limits, TenantConfig
from gateway.routes.openapi_operations import Operation, Param
from policies.control import AuditRecord, CreateKey, RotateKey, UpdateKey

_JSON = "application/json"
_KEY_ID = Param("key_id", "path", "A key's id (the 12 hex digits after `sy-`).")
_TENANT = Param("name", "path", "A tenant's name.")
_CHANGE_ERRORS = (400, 401, 403, 404, 409, 503)
_READ_ERRORS = (400, 401, 403, 404, 503)


class KeyView(msgspec.Struct):
    """An API key as the admin API shows it: never its hash. ``key`` (the secret) only in
    the answers to create and rotate. ``limits``: the key's own (every field; null:
    unlimited), or null when its tenant's ``key_limits`` apply."""

    id: str
    object: Literal["api_key"]
    tenant: str
    name: str
    status: Literal["active", "expired", "revoked"]
    created: float
    updated: float
    expires_at: float | None
    revoked_at: float | None
    previous_valid_until: float | None
    allowed_models: list[str] | None
    metadata: dict[str, str]
    limits: Limits | None = None
    key: str | None = None


class KeyList(msgspec.Struct):
    object: Literal["list"]
    data: list[KeyView]


class AuditList(msgspec.Struct):
    """Admin actions, newest first; ``has_more``: ask again with ``before`` = the last id."""

    object: Literal["list"]
    data: list[AuditRecord]
    has_more: bool


class TenantCreate(TenantConfig, frozen=True):
    """A tenant's fields as in the policy file, with its name."""

    name: str = ""


class TenantView(msgspec.Struct):
    """A tenant in force: from the policy file (``config``) or set over the API (``api``)."""

    id: str
    object: Literal["tenant"]
    source: Literal["config", "api"]
    overrides_config: bool
    config: TenantConfig


class TenantList(msgspec.Struct):
    object: Literal["list"]
    data: list[TenantView]


class ControlStatus(msgspec.Struct):
    """This replica's view of the control store."""

    backend: str
    version: int
    keys: int
    tenants: list[str]
    poll_interval_s: float
    polls: int
    reloads: int
    failures: int
    last_error: str | None
    loaded_at: float | None


def _admin(summary: str, ok: Any, errors: tuple[int, ...], **more: Any) -> Operation:
    return Operation(summary, "control", "admin", {_JSON: ok}, errors, **more)


CONTROL_OPERATIONS: dict[tuple[str, str], Operation] = {
    ("POST", "/admin/keys"): _admin(
        "Create an API key for a tenant; its secret (`key`) is in this answer only",
        KeyView,
        _CHANGE_ERRORS,
        body=CreateKey,
        ok_status=201,
    ),
    ("GET", "/admin/keys"): _admin(
        "Every API key (revoked and expired too), oldest first",
        KeyList,
        _READ_ERRORS,
        params=(Param("tenant", "query", "Only this tenant's keys."),),
    ),
    ("GET", "/admin/keys/{key_id}"): _admin(
        "One API key", KeyView, _READ_ERRORS, params=(_KEY_ID,)
    ),
    ("PATCH", "/admin/keys/{key_id}"): _admin(
        "Change a key's name, allowed models, expiry, metadata or limits",
        KeyView,
        _CHANGE_ERRORS,
        body=UpdateKey,
        params=(_KEY_ID,),
    ),
    ("POST", "/admin/keys/{key_id}/rotate"): _admin(
        "A new secret for the key (in this answer only); the old one works for "
        "`grace_seconds` more",
        KeyView,
        _CHANGE_ERRORS,
        body=RotateKey,
        params=(_KEY_ID,),
    ),
    ("POST", "/admin/keys/{key_id}/revoke"): _admin(
        "Revoke a key now (409 when it already is)",
        KeyView,
        _CHANGE_ERRORS,
        params=(_KEY_ID,),
    ),
    ("GET", "/admin/audit"): _admin(
        "The admin audit log, newest first",
        AuditList,
        _READ_ERRORS,
        params=(
            Param("limit", "query", "At most this many, 1 to 1000 (default 100)."),
            Param("before", "query", "Only records with a smaller id (the next page)."),
            Param("target", "query", "Only records about this key id or tenant."),
            Param("action", "query", "Only this action, e.g. `key.revoke`."),
        ),
    ),
    ("GET", "/admin/control"): _admin(
        "This replica's control-store view: version, polls, failures",
        ControlStatus,
        (400, 401, 403),
    ),
    ("POST", "/admin/tenants"): _admin(
        "Create a tenant (fields as in the policy file's `tenants:`)",
        TenantView,
        _CHANGE_ERRORS,
        body=TenantCreate,
        ok_status=201,
    ),
    ("GET", "/admin/tenants"): _admin(
        "Every tenant in force (the policy file's and the API's)", TenantList, _READ_ERRORS
    ),
    ("GET", "/admin/tenants/{name}"): _admin(
        "One tenant in force", TenantView, _READ_ERRORS, params=(_TENANT,)
    ),
    ("PATCH", "/admin/tenants/{name}"): _admin(
        "Change a tenant (JSON merge patch over the tenant in force; stored, it overrides "
        "the policy file's section)",
        TenantView,
        _CHANGE_ERRORS,
        body=TenantCreate,
        params=(_TENANT,),
    ),
}
