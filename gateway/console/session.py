"""Console sessions: who logged in, kept in the gateway's shared store (memory, or Redis so
that every replica behind a load balancer knows the session).

The browser holds only a random session id in an HTTP-only, SameSite=Strict cookie; the
store keeps the session under the SHA-256 of that id (a copy of the store does not hand
out live sessions). A session never holds the credential itself, only its SHA-256, so that
each request can check that the credential is still good (a revoked or rotated key, or a
changed admin key, ends its sessions at once): ``gateway.console.viewer`` does that.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Literal

import msgspec

from core.clock import Clock
from policies.store.base import Store

Role = Literal["admin", "tenant_admin"]
COOKIE = "sy_console"
LOGIN_COOKIE = "sy_console_login"  # the login form's double-submit CSRF token
COOKIE_PATH = "/console"
DEFAULT_TTL_S = 8 * 3600.0
_KEY_PREFIX = "console:session:"
_ID = re.compile(r"^[A-Za-z0-9_-]{43}$")  # token_urlsafe(32)


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """One login. ``credential_sha256``: the SHA-256 (hex) of the key that logged in;
    ``csrf``: the token every state-changing form of this session carries."""

    role: Role
    tenant: str | None
    key_id: str | None
    credential_sha256: str
    csrf: str
    created: float
    expires: float


_decoder = msgspec.json.Decoder(Session)


def new_token() -> str:
    """256 random bits, URL-safe (session ids and CSRF tokens)."""
    return secrets.token_urlsafe(32)


def credential_digest(credential: str) -> str:
    return hashlib.sha256(credential.encode()).hexdigest()


def _store_key(session_id: str) -> str:
    return _KEY_PREFIX + hashlib.sha256(session_id.encode()).hexdigest()


class SessionStore:
    """Sessions in ``store`` for ``ttl_s`` seconds from login (``clock.wall()``). Every
    method may raise ``StoreUnavailableError``."""

    def __init__(self, store: Store, clock: Clock, ttl_s: float = DEFAULT_TTL_S) -> None:
        self._store = store
        self._clock = clock
        self.ttl_s = ttl_s

    async def create(
        self, role: Role, tenant: str | None, key_id: str | None, credential: str
    ) -> tuple[str, Session]:
        """A new session: (the id for the cookie, the session)."""
        now = self._clock.wall()
        session = Session(
            role=role,
            tenant=tenant,
            key_id=key_id,
            credential_sha256=credential_digest(credential),
            csrf=new_token(),
            created=now,
            expires=now + self.ttl_s,
        )
        session_id = new_token()
        await self._store.set(_store_key(session_id), msgspec.json.encode(session), self.ttl_s)
        return session_id, session

    async def load(self, session_id: str | None) -> Session | None:
        """The live session behind a cookie value, or None (absent, malformed, unknown,
        expired, or unreadable)."""
        if not session_id or not _ID.fullmatch(session_id):
            return None  # never a store round trip for junk
        raw = await self._store.get(_store_key(session_id))
        if raw is None:
            return None
        try:
            session = _decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        return session if self._clock.wall() < session.expires else None

    async def delete(self, session_id: str | None) -> None:
        if session_id and _ID.fullmatch(session_id):
            await self._store.delete(_store_key(session_id))
