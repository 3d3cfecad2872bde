"""What the control plane stores: API keys, tenants set over the admin API, and the audit
log; plus the pure changes made to a key (create, rotate, revoke, edit) and the rule that
says whether a presented secret opens a key.

Keys keep the format of ``policies.auth.keys``: ``sy-<key_id>-<secret>``, only the SHA-256
of the whole key stored, compared with ``hmac.compare_digest``. Times are Unix seconds.
"""

from __future__ import annotations

import base64
import hmac
import math
import secrets
from collections.abc import Callable
from typing import Any

import msgspec

from core.config_tenants import Limits, TenantConfig
from policies.auth.keys import KEY_PREFIX, SECRET_BYTES, generate_key, hash_key
from policies.control.errors import ConflictError

MAX_TAGS = 32
MAX_TAG_KEY = 64
MAX_TAG_VALUE = 256


class KeyRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One API key. ``previous_sha256`` is the secret a rotation replaced, still accepted
    until ``previous_valid_until``. ``allowed_models`` None means every model the tenant
    may use; ``metadata`` (string tags) is copied into the key's usage rows. ``limits``
    replace the tenant's ``key_limits`` for this key (None: the tenant's apply; a field
    None: unlimited); the tenant's own ``limits`` apply either way."""

    key_id: str
    tenant: str
    name: str
    sha256: str
    created: float
    updated: float
    expires_at: float | None = None
    revoked_at: float | None = None
    previous_sha256: str | None = None
    previous_valid_until: float | None = None
    allowed_models: list[str] | None = None
    metadata: dict[str, str] = {}
    limits: Limits | None = None

    def state(self, now: float) -> str:
        """``active``, ``expired`` or ``revoked`` at Unix time ``now``."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "active"

    def opens(self, digest: str, now: float) -> bool:
        """Whether a presented key whose SHA-256 is ``digest`` opens this key at ``now``:
        never when revoked or expired; the current secret always; the one a rotation
        replaced until its grace period ends. Both digests are compared (constant time)
        so the answer's timing does not say which one matched."""
        if self.state(now) != "active":
            return False
        current = hmac.compare_digest(self.sha256, digest)
        previous = self.previous_sha256 or ""
        in_grace = self.previous_valid_until is not None and now < self.previous_valid_until
        old = hmac.compare_digest(previous, digest) if previous else False
        return current or (old and in_grace)


class TenantRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant as set over the admin API: it replaces the policy file's section of the
    same name (if any) as a whole."""

    name: str
    config: TenantConfig
    created: float
    updated: float


class AuditRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One admin action: who (``actor``), what (``action`` on ``target``), when (``at``),
    and the details (never a secret or its hash)."""

    id: int
    at: float
    actor: str
    action: str
    target: str
    details: dict[str, Any] = {}


class AuditEntry(msgspec.Struct, frozen=True):
    """An audit record before the store numbers it."""

    actor: str
    action: str
    target: str
    details: dict[str, Any] = {}


def new_key(
    tenant: str,
    name: str,
    now: float,
    *,
    expires_at: float | None = None,
    allowed_models: list[str] | None = None,
    metadata: dict[str, str] | None = None,
    limits: Limits | None = None,
    token_bytes: Callable[[int], bytes] = secrets.token_bytes,
) -> tuple[str, KeyRecord]:
    """(plaintext to show once, record to store) for a new key."""
    plaintext, legacy = generate_key(tenant, name, created=now, token_bytes=token_bytes)
    record = KeyRecord(
        key_id=legacy.key_id,
        tenant=tenant,
        name=name,
        sha256=legacy.sha256,
        created=now,
        updated=now,
        expires_at=expires_at,
        allowed_models=allowed_models,
        metadata=dict(metadata or {}),
        limits=limits,
    )
    return plaintext, record


def new_secret_for(key_id: str, token_bytes: Callable[[int], bytes] = secrets.token_bytes) -> str:
    """A fresh plaintext for ``key_id`` (same id, new secret), for a rotation."""
    secret = base64.urlsafe_b64encode(token_bytes(SECRET_BYTES)).rstrip(b"=").decode()
    return f"{KEY_PREFIX}{key_id}-{secret}"


def _require_live(record: KeyRecord, doing: str) -> None:
    if record.revoked_at is not None:
        raise ConflictError(
            f"Key '{record.key_id}' is revoked; it cannot be {doing}.", code="key_revoked"
        )


def rotated(record: KeyRecord, plaintext: str, now: float, grace_s: float) -> KeyRecord:
    """``record`` with ``plaintext`` as its secret; the current one stays valid for
    ``grace_s`` seconds (0: at once invalid). A secret still in an earlier grace period
    ends now: only one old secret is ever kept. 409 for a revoked key."""
    _require_live(record, "rotated")
    return msgspec.structs.replace(
        record,
        sha256=hash_key(plaintext),
        previous_sha256=record.sha256 if grace_s > 0 else None,
        previous_valid_until=now + grace_s if grace_s > 0 else None,
        updated=now,
    )


def revoked(record: KeyRecord, now: float) -> KeyRecord:
    """``record`` revoked at ``now``; 409 when it already is (the first time stays)."""
    _require_live(record, "revoked again")
    return msgspec.structs.replace(record, revoked_at=now, updated=now)


def edited(record: KeyRecord, changes: dict[str, Any], now: float) -> KeyRecord:
    """``record`` with ``changes`` (any of ``name``, ``allowed_models``, ``expires_at``,
    ``metadata``, ``limits``) applied; 409 for a revoked key."""
    _require_live(record, "changed")
    allowed = {"name", "allowed_models", "expires_at", "metadata", "limits"}
    unknown = set(changes) - allowed
    if unknown:
        raise ValueError(f"not editable: {sorted(unknown)}")
    return msgspec.structs.replace(record, **changes, updated=now)


def check_metadata(metadata: dict[str, str]) -> str | None:
    """Why these tags are not acceptable, or None."""
    if len(metadata) > MAX_TAGS:
        return f"at most {MAX_TAGS} metadata entries"
    for key, value in metadata.items():
        if not key or len(key) > MAX_TAG_KEY:
            return f"metadata keys have 1 to {MAX_TAG_KEY} characters"
        if len(value) > MAX_TAG_VALUE:
            return f"metadata values have at most {MAX_TAG_VALUE} characters"
    return None


def public_view(record: KeyRecord, now: float) -> dict[str, Any]:
    """The key as the admin API shows it: never its hash (nor the old one's)."""
    return {
        "id": record.key_id,
        "object": "api_key",
        "tenant": record.tenant,
        "name": record.name,
        "status": record.state(now),
        "created": record.created,
        "updated": record.updated,
        "expires_at": record.expires_at,
        "revoked_at": record.revoked_at,
        "previous_valid_until": (
            record.previous_valid_until
            if record.previous_valid_until is not None and now < record.previous_valid_until
            else None
        ),
        "allowed_models": record.allowed_models,
        "metadata": record.metadata,
        "limits": limits_view(record.limits),
    }


def limits_view(limits: Limits | None) -> dict[str, Any] | None:
    """A key's own limits as JSON shows them (every field, None: unlimited), or None when
    its tenant's ``key_limits`` apply."""
    return None if limits is None else msgspec.to_builtins(limits)


def check_limits(limits: Limits) -> str | None:
    """The field (``limits.<name>``) whose value is not a finite positive number, or None.
    The admin API's decoder already refuses these; this guards requests built in code."""
    for name in limits.__struct_fields__:
        value = getattr(limits, name)
        if value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not (number and math.isfinite(value) and value > 0):
            return f"limits.{name}"
    return None
