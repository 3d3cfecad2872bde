"""Who is looking at the console, and what they may see.

Two kinds of people log in: the gateway's admin (the admin key: every page, every tenant)
and a tenant admin: an API key of the control plane whose metadata has
``console_role: tenant_admin`` (``POST /admin/keys`` with that metadata, or the console's
own key form). A tenant admin sees only its own tenant's pages and data; any other tenant,
key or page answers 404 as if it did not exist. Any other credential is refused at login.

Every request re-checks the session's credential (by its SHA-256): a revoked, expired or
rotated-away key, a key that lost the role, a removed tenant or a changed admin key ends
the session at once.
"""

from __future__ import annotations

import hmac
from typing import Any

import msgspec
from litestar import Request

from core.errors import AuthenticationError, PermissionDeniedError
from gateway.console.session import COOKIE, Session, SessionStore, credential_digest
from gateway.process.state import GatewayState
from policies.control import KeyRecord, NotFoundError

ROLE_TAG = "console_role"
TENANT_ADMIN = "tenant_admin"


class Viewer(msgspec.Struct, frozen=True, kw_only=True):
    """The logged-in person behind one request."""

    session_id: str
    session: Session

    @property
    def admin(self) -> bool:
        return self.session.role == "admin"

    @property
    def tenant(self) -> str | None:
        """The tenant a tenant admin is bound to (None for the admin)."""
        return self.session.tenant

    @property
    def actor(self) -> str:
        """Who the audit log names for this viewer's changes."""
        return "admin" if self.admin else f"console:{self.session.key_id}"

    def may_see(self, tenant: str | None) -> bool:
        return self.admin or (tenant is not None and tenant == self.session.tenant)

    def scope(self, requested: str | None) -> str | None:
        """The tenant a page shows: the admin's choice (None: every tenant), or the tenant
        admin's own tenant. A tenant admin naming another tenant gets 404."""
        if self.admin:
            return requested or None
        if requested and requested != self.session.tenant:
            raise not_found()
        return self.session.tenant

    def require_admin(self) -> None:
        if not self.admin:
            raise not_found()


def not_found() -> NotFoundError:
    return NotFoundError("There is no such page.", code="not_found")


def is_tenant_admin(record: KeyRecord | None) -> bool:
    return record is not None and record.metadata.get(ROLE_TAG) == TENANT_ADMIN


def sessions(state: GatewayState) -> SessionStore:
    """The session store of this gateway (its shared store)."""
    return SessionStore(state.stores.shared, state.clock)


async def log_in(state: GatewayState, credential: str) -> tuple[str, Session]:
    """Check ``credential`` and open a session: (id for the cookie, session). 401 for a
    credential that is not valid, 403 for one that is valid but not a console one."""
    credential = credential.strip()
    if not credential:
        raise AuthenticationError("Enter the admin key or a tenant admin key.")
    auth = state.runtime.auth
    principal = auth.authenticate({"authorization": f"Bearer {credential}"})
    store = sessions(state)
    if principal.admin:
        return await store.create("admin", None, None, credential)
    control = state.control
    record = control.index.record(principal.key_id or "") if control is not None else None
    if principal.via == "api_key" and is_tenant_admin(record) and record is not None:
        return await store.create("tenant_admin", record.tenant, record.key_id, credential)
    raise PermissionDeniedError(
        "This key may call the API but not open the console: use the admin key, or a "
        f"tenant key whose metadata has {ROLE_TAG}: {TENANT_ADMIN}.",
        code="not_a_console_key",
    )


def still_valid(state: GatewayState, session: Session) -> bool:
    """Whether the credential that opened ``session`` would still be let in now."""
    if session.role == "admin":
        name = state.runtime.config.auth.admin_key_env
        admin_key = state.env.get(name) if name else None
        return bool(admin_key) and hmac.compare_digest(
            credential_digest(admin_key or ""), session.credential_sha256
        )
    control = state.control
    if control is None or session.key_id is None:
        return False
    record = control.index.record(session.key_id)
    return (
        is_tenant_admin(record)
        and record is not None
        and record.tenant == session.tenant
        and record.tenant in state.runtime.config.tenants
        and record.opens(session.credential_sha256, state.clock.wall())
    )


async def current_viewer(request: Request[Any, Any, Any]) -> Viewer | None:
    """The viewer of this request, or None when it carries no live session. Raises
    ``StoreUnavailableError`` when the session store cannot be read."""
    state: GatewayState = request.app.state.gateway
    session_id = request.cookies.get(COOKIE)
    session = await sessions(state).load(session_id)
    if session is None or session_id is None or not still_valid(state, session):
        return None
    return Viewer(session_id=session_id, session=session)


class LoginRequired(Exception):
    """No live session: the console answers with its login page."""


async def require_viewer(request: Request[Any, Any, Any]) -> Viewer:
    """The viewer, else ``LoginRequired``."""
    viewer = await current_viewer(request)
    if viewer is None:
        raise LoginRequired
    return viewer
