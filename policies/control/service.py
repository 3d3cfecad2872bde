"""``ControlPlane``: the admin operations on keys and tenants, checked, applied to the
store with their audit records. The admin API and ``switchyard keys`` both call it.

Errors: ``InvalidRequestError`` (400) for a request that cannot be right (unknown tenant
or alias in a key, an expiry in the past, bad tags), ``NotFoundError`` (404),
``ConflictError`` (409: revoked keys, a tenant that exists), ``ControlUnavailableError``
(503) from the store.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from core.clock import Clock
from core.config_tenants import TenantConfig
from core.errors import InvalidRequestError
from policies.auth.keys import KeyRecord as FileKeyRecord
from policies.control.errors import ConflictError, NotFoundError
from policies.control.records import (
    AuditEntry,
    KeyRecord,
    TenantRecord,
    check_limits,
    check_metadata,
    edited,
    limits_view,
    new_key,
    new_secret_for,
    revoked,
    rotated,
)
from policies.control.requests import Catalog, CreateKey, RotateKey, UpdateKey, tenant_fields, unix
from policies.control.store import ControlStore

KEYS_FILE_ACTOR = "keys_file"


def _invalid(message: str, param: str | None = None, code: str | None = None) -> None:
    raise InvalidRequestError(message, param=param, code=code)


def _unknown_tenant(name: str) -> NotFoundError:
    return NotFoundError(f"No tenant named '{name}'.", param="tenant", code="tenant_not_found")


class ControlPlane:
    """Admin operations over ``store``; ``clock.wall()`` stamps them; ``token_bytes`` is
    the randomness of new secrets."""

    def __init__(
        self,
        store: ControlStore,
        clock: Clock,
        *,
        token_bytes: Callable[[int], bytes] = secrets.token_bytes,
    ) -> None:
        self.store = store
        self._clock = clock
        self._token_bytes = token_bytes

    # -- keys ------------------------------------------------------------------------------

    def _check_key_fields(self, changes: Mapping[str, Any], catalog: Catalog) -> None:
        for alias in changes.get("allowed_models") or ():
            if alias not in catalog.models:
                _invalid(f"Unknown model alias '{alias}'.", "allowed_models", "model_not_found")
        problem = check_metadata(changes.get("metadata") or {})
        if problem:
            _invalid(f"Invalid metadata: {problem}.", "metadata")
        limits = changes.get("limits")
        wrong = check_limits(limits) if limits is not None else None
        if wrong:
            _invalid(f"Invalid {wrong}: a limit is a positive number (or null).", wrong)

    async def create_key(
        self, request: CreateKey, catalog: Catalog, actor: str
    ) -> tuple[str, KeyRecord]:
        """A new key for an existing tenant: (plaintext, shown once; record)."""
        if request.tenant not in catalog.tenants:
            raise _unknown_tenant(request.tenant)
        fields = msgspec.structs.asdict(request)
        self._check_key_fields(fields, catalog)
        now = self._clock.wall()
        expires_at = unix(request.expires_at)
        if expires_at is not None and expires_at <= now:
            _invalid("expires_at is in the past.", "expires_at", "expires_in_past")
        plaintext, record = new_key(
            request.tenant,
            request.name,
            now,
            expires_at=expires_at,
            allowed_models=request.allowed_models,
            metadata=request.metadata,
            limits=request.limits,
            token_bytes=self._token_bytes,
        )
        details = {
            "tenant": record.tenant,
            "name": record.name,
            "expires_at": record.expires_at,
            "allowed_models": record.allowed_models,
            "metadata": record.metadata,
            "limits": limits_view(record.limits),
        }
        await self.store.create_key(record, AuditEntry(actor, "key.create", record.key_id, details))
        return plaintext, record

    async def get_key(self, key_id: str) -> KeyRecord:
        record = await self.store.get_key(key_id)
        if record is None:
            raise NotFoundError(f"No API key with id '{key_id}'.", code="key_not_found")
        return record

    async def list_keys(self, tenant: str | None = None) -> list[KeyRecord]:
        return await self.store.list_keys(tenant)

    async def rotate_key(
        self, key_id: str, request: RotateKey, actor: str
    ) -> tuple[str, KeyRecord]:
        """A new secret for the key; the current one keeps working ``grace_seconds``."""
        plaintext = new_secret_for(key_id, self._token_bytes)
        now = self._clock.wall()
        grace = request.grace_seconds

        def change(record: KeyRecord) -> tuple[KeyRecord, AuditEntry]:
            after = rotated(record, plaintext, now, grace)
            details = {"grace_seconds": grace, "previous_valid_until": after.previous_valid_until}
            return after, AuditEntry(actor, "key.rotate", key_id, details)

        return plaintext, await self.store.change_key(key_id, change)

    async def revoke_key(self, key_id: str, actor: str) -> KeyRecord:
        """Revoke the key at once; 409 when it already is."""
        now = self._clock.wall()

        def change(record: KeyRecord) -> tuple[KeyRecord, AuditEntry]:
            return revoked(record, now), AuditEntry(actor, "key.revoke", key_id, {})

        return await self.store.change_key(key_id, change)

    async def update_key(
        self, key_id: str, request: UpdateKey, catalog: Catalog, actor: str
    ) -> KeyRecord:
        """Change a key's name, models, expiry, metadata or limits; an expiry in the past
        expires the key now."""
        changes = request.changes()
        if not changes:
            _invalid(
                "Nothing to change: give name, allowed_models, expires_at, metadata or limits."
            )
        self._check_key_fields(changes, catalog)
        now = self._clock.wall()

        details = dict(changes)
        if "limits" in details:  # every field, as GET shows them
            details["limits"] = limits_view(details["limits"])

        def change(record: KeyRecord) -> tuple[KeyRecord, AuditEntry]:
            return edited(record, changes, now), AuditEntry(actor, "key.update", key_id, details)

        return await self.store.change_key(key_id, change)

    async def import_keys_file(self, records: list[FileKeyRecord]) -> list[KeyRecord]:
        """Copy keys from ``auth.keys_file`` whose ids the store lacks (hash, tenant, name,
        times); audited as ``key.import`` by ``keys_file``."""
        converted = [
            KeyRecord(
                key_id=r.key_id,
                tenant=r.tenant,
                name=r.name,
                sha256=r.sha256,
                created=r.created,
                updated=r.revoked_at or r.created,
                revoked_at=r.revoked_at,
            )
            for r in records
        ]

        def entry(record: KeyRecord) -> AuditEntry:
            details = {"tenant": record.tenant, "name": record.name}
            return AuditEntry(KEYS_FILE_ACTOR, "key.import", record.key_id, details)

        return await self.store.import_keys(converted, entry)

    # -- tenants ---------------------------------------------------------------------------

    def _checked(
        self, name: str, raw: Mapping[str, Any], base: TenantConfig | None, catalog: Catalog
    ) -> TenantConfig:
        try:
            config = tenant_fields(raw, base)
        except msgspec.ValidationError as exc:
            raise InvalidRequestError(f"Invalid tenant '{name}': {exc}") from exc
        problems = catalog.tenant_problems(config)
        if problems:
            _invalid(f"Invalid tenant '{name}': " + "; ".join(problems))
        return config

    async def create_tenant(
        self, name: str, raw: Mapping[str, Any], catalog: Catalog, actor: str
    ) -> TenantRecord:
        """A new tenant (409 when the policy file or the API already has it)."""
        if name in catalog.tenants:
            raise ConflictError(
                f"Tenant '{name}' exists; change it with PATCH /admin/tenants/{name}.",
                code="tenant_exists",
            )
        config = self._checked(name, raw, None, catalog)
        now = self._clock.wall()

        def change(current: TenantRecord | None) -> tuple[TenantRecord, AuditEntry]:
            if current is not None:  # created through another replica a moment ago
                raise ConflictError(f"Tenant '{name}' exists.", code="tenant_exists")
            record = TenantRecord(name=name, config=config, created=now, updated=now)
            return record, AuditEntry(actor, "tenant.create", name, dict(raw))

        return await self.store.change_tenant(name, change)

    async def update_tenant(
        self, name: str, raw: Mapping[str, Any], catalog: Catalog, actor: str
    ) -> TenantRecord:
        """Merge ``raw`` (RFC 7396) over the tenant in force; the result overrides the
        policy file's section for this tenant from now on."""
        seed = catalog.tenants.get(name)
        if seed is None:
            raise _unknown_tenant(name)
        if not raw:
            _invalid("Nothing to change: give the tenant fields to set.")
        self._checked(name, raw, seed, catalog)  # a bad request fails before any write
        now = self._clock.wall()

        def change(current: TenantRecord | None) -> tuple[TenantRecord, AuditEntry]:
            # over the stored record, not this replica's view of it: no lost updates
            base = current.config if current is not None else seed
            config = self._checked(name, raw, base, catalog)
            created = current.created if current is not None else now
            record = TenantRecord(name=name, config=config, created=created, updated=now)
            return record, AuditEntry(actor, "tenant.update", name, dict(raw))

        return await self.store.change_tenant(name, change)
