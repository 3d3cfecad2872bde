"""The console's state-changing forms (POST): log in and out; create, rotate and revoke
keys; change a tenant's limits, models and budgets. Every one passes the CSRF checks of
``gateway.console.csrf`` first. Key and tenant changes go through the control plane's own
operations (``ControlPlane``, what ``/admin/keys`` and ``/admin/tenants`` call), audited
with the viewer as actor; a tenant admin may manage only its own tenant's keys."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import Cookie

from core.errors import GatewayError, InvalidRequestError, PermissionDeniedError
from gateway.console import csrf
from gateway.console.data import LIMIT_FIELDS
from gateway.console.pages import is_https, login_page
from gateway.console.render import html, redirect, tenant_page
from gateway.console.session import COOKIE, COOKIE_PATH, LOGIN_COOKIE, Session
from gateway.console.state import state_of
from gateway.console.viewer import (
    ROLE_TAG,
    TENANT_ADMIN,
    Viewer,
    log_in,
    not_found,
    require_viewer,
    sessions,
)
from gateway.process.control import GatewayControl
from gateway.process.state import GatewayState
from policies.control import CreateKey, KeyRecord, RotateKey, public_view

FormData = dict[str, list[str]]
ROTATE_GRACE_S = 3600.0


class CrossSiteRefused(PermissionDeniedError):
    """403: a state-changing request that did not come from the console's own form."""


async def _form(request: Request[Any, Any, Any]) -> FormData:
    form = await request.form()
    return {key: form.getall(key) for key in form}


def _first(form: FormData, name: str) -> str:
    values = form.get(name) or [""]
    return values[0].strip()


def _refuse_cross_site(request: Request[Any, Any, Any], token: str | None, given: str) -> None:
    reason = csrf.cross_site_reason(request.headers, request.headers.get("host"))
    if reason is None and not csrf.tokens_match(token, given):
        reason = "the form's CSRF token is missing or wrong (reload the page and try again)"
    if reason is not None:
        raise CrossSiteRefused(f"Refused: {reason}.", code="csrf_failed")


async def checked_form(request: Request[Any, Any, Any]) -> tuple[Viewer, FormData]:
    """The viewer and the form of a state-changing request, after the CSRF checks."""
    viewer = await require_viewer(request)
    form = await _form(request)
    given = _first(form, csrf.FIELD) or request.headers.get(csrf.HEADER, "")
    _refuse_cross_site(request, viewer.session.csrf, given)
    return viewer, form


def _session_cookie(request: Request[Any, Any, Any], value: str, max_age: int) -> Cookie:
    return Cookie(
        key=COOKIE,
        value=value,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=is_https(request),
        max_age=max_age,
    )


def _expired(request: Request[Any, Any, Any], key: str) -> Cookie:
    return Cookie(key=key, value="", path=COOKIE_PATH, httponly=True, samesite="strict",
                  secure=is_https(request), max_age=0)  # fmt: skip


@post("/login", status_code=303)
async def login(request: Request[Any, Any, Any]) -> Response[str]:
    """Open a session for the admin key or a tenant admin key (double-submit CSRF)."""
    form = await _form(request)
    _refuse_cross_site(request, request.cookies.get(LOGIN_COOKIE), _first(form, csrf.FIELD))
    state = state_of(request)
    try:
        session_id, session = await log_in(state, _first(form, "credential"))
    except GatewayError as exc:
        if exc.status not in (401, 403):
            raise
        return login_page(request, exc.message, exc.status)
    cookies = [
        _session_cookie(request, session_id, _max_age(session)),
        _expired(request, LOGIN_COOKIE),
    ]
    return redirect("/console/overview", cookies)


def _max_age(session: Session) -> int:
    return max(1, int(session.expires - session.created))


@post("/logout", status_code=303)
async def logout(request: Request[Any, Any, Any]) -> Response[str]:
    viewer, _ = await checked_form(request)
    await sessions(state_of(request)).delete(viewer.session_id)
    return redirect("/console/login", [_expired(request, COOKIE)])


def _control(state: GatewayState) -> GatewayControl:
    if state.control is None:
        raise InvalidRequestError(
            "This gateway has no control plane: add a `control:` section to its policy file.",
            code="control_plane_disabled",
        )
    return state.control


def _create_request(tenant: str, form: FormData, now: float) -> CreateKey:
    days = _first(form, "expires_in_days")
    fields: dict[str, Any] = {"tenant": tenant, "name": _first(form, "name") or "default"}
    models = [m for m in form.get("allowed_models", []) if m]
    if models:
        fields["allowed_models"] = models
    if days:
        fields["expires_at"] = now + _positive(days, "expires_in_days") * 86400.0
    if _first(form, "tenant_admin"):
        fields["metadata"] = {ROLE_TAG: TENANT_ADMIN}
    try:
        return msgspec.convert(fields, CreateKey)
    except msgspec.ValidationError as exc:
        raise InvalidRequestError(f"Invalid key: {exc}") from exc


def _positive(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e6:
        raise InvalidRequestError(f"{name} must be a number above 0; got {text[:32]!r}", param=name)
    return value


@post("/tenants/{tenant:str}/keys", status_code=201)
async def create_key(request: Request[Any, Any, Any], tenant: str) -> Response[str]:
    """A new key; its secret is on this answer's page only."""
    viewer, form = await checked_form(request)
    if not viewer.may_see(tenant):
        raise not_found()
    state = state_of(request)
    control = _control(state)
    body = _create_request(tenant, form, state.clock.wall())
    catalog = control.catalog(state.runtime.config)
    secret, record = await control.plane.create_key(body, catalog, viewer.actor)
    await control.changed()
    return _secret_page(state, viewer, "Key created", secret, record, 201)


async def _own_key(state: GatewayState, viewer: Viewer, key_id: str) -> KeyRecord:
    """The key, if the viewer may manage it (404 otherwise, as for an unknown key)."""
    record = await _control(state).plane.get_key(key_id)
    if not viewer.may_see(record.tenant):
        raise not_found()
    return record


@post("/keys/{key_id:str}/rotate", status_code=200)
async def rotate_key(request: Request[Any, Any, Any], key_id: str) -> Response[str]:
    """A new secret (shown once); the old one keeps working for an hour."""
    viewer, _ = await checked_form(request)
    state = state_of(request)
    await _own_key(state, viewer, key_id)
    control = _control(state)
    grace = RotateKey(grace_seconds=ROTATE_GRACE_S)
    secret, record = await control.plane.rotate_key(key_id, grace, viewer.actor)
    await control.changed()
    return _secret_page(state, viewer, "Key rotated", secret, record, 200)


@post("/keys/{key_id:str}/revoke", status_code=303)
async def revoke_key(request: Request[Any, Any, Any], key_id: str) -> Response[str]:
    viewer, _ = await checked_form(request)
    state = state_of(request)
    record = await _own_key(state, viewer, key_id)
    control = _control(state)
    await control.plane.revoke_key(key_id, viewer.actor)
    await control.changed()
    return redirect(tenant_page(record.tenant))


def _secret_page(
    state: GatewayState, viewer: Viewer, heading: str, secret: str, record: KeyRecord, status: int
) -> Response[str]:
    key = public_view(record, state.clock.wall())
    return html(
        "key_secret.html",
        status=status,
        title=heading,
        viewer=viewer,
        page="tenants",
        heading=heading,
        secret=secret,
        key=key,
    )


_WHOLE = frozenset({"rpm", "tpm", "concurrency"})


def _settings_patch(form: FormData) -> dict[str, Any]:
    """The tenant PATCH (RFC 7396) the settings form asks for: an empty limit is
    unlimited (null), an empty model list is every alias (null)."""
    limits: dict[str, Any] = {}
    for field in LIMIT_FIELDS:
        text = _first(form, field)
        if not text:
            limits[field] = None
        elif field in _WHOLE:
            limits[field] = int(_positive(text, field)) if text.isdigit() else _not_whole(field)
        else:
            limits[field] = _positive(text, field)
    models = [m.strip() for m in _first(form, "models").split(",") if m.strip()]
    return {"limits": limits, "models": models or None}


def _not_whole(field: str) -> int:
    raise InvalidRequestError(f"{field} must be a whole number above 0.", param=field)


@post("/tenants/{tenant:str}/settings", status_code=303)
async def tenant_settings(request: Request[Any, Any, Any], tenant: str) -> Response[str]:
    """Change a tenant's limits, budgets and models (the admin only)."""
    viewer, form = await checked_form(request)
    viewer.require_admin()
    state = state_of(request)
    control = _control(state)
    catalog = control.catalog(state.runtime.config)
    await control.plane.update_tenant(tenant, _settings_patch(form), catalog, viewer.actor)
    await control.changed()
    return redirect(tenant_page(tenant))
