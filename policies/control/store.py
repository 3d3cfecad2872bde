"""``ControlStore``: keys, API tenants and the audit log in a SQL database (SQLite or
PostgreSQL, ``policies.control.database``), durable, shared by every replica.

Every change is one write transaction that bumps the change counter first, writes the row
and appends its audit record: a change and its audit record exist together or not at all,
and ``version()`` moves exactly when something changed. Readers take a ``Snapshot``
(the counter first, then the rows: rows are never older than the version they carry).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from core.clock import Clock
from core.config_tenants import Limits, TenantConfig
from policies.control.database import Database, Tx, migrate
from policies.control.errors import ConflictError, NotFoundError
from policies.control.records import AuditEntry, AuditRecord, KeyRecord, TenantRecord

KEY_COLUMNS = (
    "key_id",
    "tenant",
    "name",
    "sha256",
    "created",
    "updated",
    "expires_at",
    "revoked_at",
    "previous_sha256",
    "previous_valid_until",
    "allowed_models",
    "metadata",
    "limits",  # JSON; NULL: the tenant's key_limits apply (migration 2)
)
_KEYS = ", ".join(KEY_COLUMNS)
_KEY_UPSERT = (
    f"INSERT INTO control_keys ({_KEYS}) VALUES ({', '.join('?' for _ in KEY_COLUMNS)}) "
    "ON CONFLICT (key_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in KEY_COLUMNS[1:])
)
_TENANT_UPSERT = (
    "INSERT INTO control_tenants (name, config, created, updated) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (name) DO UPDATE SET config = excluded.config, updated = excluded.updated"
)
_json = msgspec.json.Encoder()
_models = msgspec.json.Decoder(list[str] | None)
_tags = msgspec.json.Decoder(dict[str, str])
_limits = msgspec.json.Decoder(Limits)
_tenant_config = msgspec.json.Decoder(TenantConfig)
_details = msgspec.json.Decoder(dict[str, Any])

KeyChange = Callable[[KeyRecord], tuple[KeyRecord, AuditEntry]]
TenantChange = Callable[[TenantRecord | None], tuple[TenantRecord, AuditEntry]]


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a replica's index holds, as of change counter ``version``."""

    version: int
    keys: list[KeyRecord]
    tenants: list[TenantRecord]


def _key_params(record: KeyRecord) -> tuple[Any, ...]:
    models = None if record.allowed_models is None else _json.encode(record.allowed_models)
    limits = None if record.limits is None else _json.encode(record.limits).decode()
    return (
        record.key_id,
        record.tenant,
        record.name,
        record.sha256,
        record.created,
        record.updated,
        record.expires_at,
        record.revoked_at,
        record.previous_sha256,
        record.previous_valid_until,
        None if models is None else models.decode(),
        _json.encode(record.metadata).decode(),
        limits,
    )


def _key_record(row: Sequence[Any]) -> KeyRecord:
    fields = dict(zip(KEY_COLUMNS, row, strict=True))
    models = fields.pop("allowed_models")
    fields["allowed_models"] = None if models is None else _models.decode(models)
    fields["metadata"] = _tags.decode(fields["metadata"])
    limits = fields.pop("limits")
    fields["limits"] = None if limits is None else _limits.decode(limits)
    return KeyRecord(**fields)


def _tenant_record(row: Sequence[Any]) -> TenantRecord:
    name, config, created, updated = row
    return TenantRecord(
        name=name, config=_tenant_config.decode(config), created=created, updated=updated
    )


class ControlStore:
    """The control plane's source of truth on ``db``; ``clock.wall()`` stamps audit
    records. Methods raise ``ControlUnavailableError`` when the database fails (nothing
    changed), ``NotFoundError``/``ConflictError`` as documented."""

    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self._clock = clock

    async def open(self) -> list[int]:
        """Create or upgrade the schema (idempotent); the migration versions applied."""
        return await migrate(self.db, self._clock.wall())

    async def aclose(self) -> None:
        await self.db.aclose()

    # -- reads -----------------------------------------------------------------------------

    async def version(self) -> int:
        """The change counter: it moves with every committed change."""
        async with self.db.transaction(write=False) as tx:
            rows = await tx.fetchall("SELECT version FROM control_version WHERE id = 1")
        return int(rows[0][0])

    async def snapshot(self) -> Snapshot:
        """Every key and API tenant, with the counter read before them."""
        async with self.db.transaction(write=False) as tx:
            version = await tx.fetchall("SELECT version FROM control_version WHERE id = 1")
            keys = await tx.fetchall(f"SELECT {_KEYS} FROM control_keys")
            tenants = await tx.fetchall(
                "SELECT name, config, created, updated FROM control_tenants"
            )
        return Snapshot(
            version=int(version[0][0]),
            keys=[_key_record(row) for row in keys],
            tenants=[_tenant_record(row) for row in tenants],
        )

    async def get_key(self, key_id: str) -> KeyRecord | None:
        async with self.db.transaction(write=False) as tx:
            return await _read_key(tx, key_id)

    async def list_keys(self, tenant: str | None = None) -> list[KeyRecord]:
        """Keys (revoked ones too), oldest first; only ``tenant``'s when given."""
        where, args = ("WHERE tenant = ? ", (tenant,)) if tenant is not None else ("", ())
        query = f"SELECT {_KEYS} FROM control_keys {where}ORDER BY created, key_id"
        async with self.db.transaction(write=False) as tx:
            rows = await tx.fetchall(query, args)
        return [_key_record(row) for row in rows]

    async def list_tenants(self) -> list[TenantRecord]:
        async with self.db.transaction(write=False) as tx:
            rows = await tx.fetchall(
                "SELECT name, config, created, updated FROM control_tenants ORDER BY name"
            )
        return [_tenant_record(row) for row in rows]

    async def audit(
        self,
        *,
        limit: int = 100,
        before: int | None = None,
        target: str | None = None,
        action: str | None = None,
    ) -> list[AuditRecord]:
        """Audit records, newest first: ``limit`` of them, with ids below ``before``, and
        only for ``target`` / ``action`` when given."""
        where: list[str] = []
        args: list[Any] = []
        for column, value in (("id < ?", before), ("target = ?", target), ("action = ?", action)):
            if value is not None:
                where.append(column)
                args.append(value)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        query = (
            "SELECT id, at, actor, action, target, details FROM control_audit "
            f"{clause}ORDER BY id DESC LIMIT ?"
        )
        async with self.db.transaction(write=False) as tx:
            rows = await tx.fetchall(query, (*args, limit))
        return [
            AuditRecord(
                id=int(row[0]),
                at=row[1],
                actor=row[2],
                action=row[3],
                target=row[4],
                details=_details.decode(row[5]),
            )
            for row in rows
        ]

    # -- writes ----------------------------------------------------------------------------

    @asynccontextmanager
    async def _writing(self) -> AsyncIterator[Tx]:
        """A write transaction that has already moved the change counter."""
        async with self.db.transaction(write=True) as tx:
            await tx.execute("UPDATE control_version SET version = version + 1 WHERE id = 1")
            yield tx

    async def _audit(self, tx: Tx, entry: AuditEntry) -> None:
        await tx.execute(
            "INSERT INTO control_audit (at, actor, action, target, details) VALUES (?, ?, ?, ?, ?)",
            (
                self._clock.wall(),
                entry.actor,
                entry.action,
                entry.target,
                _json.encode(entry.details).decode(),
            ),
        )

    async def create_key(self, record: KeyRecord, entry: AuditEntry) -> None:
        """Store a new key; 409 when its id is taken (48 random bits: rare, not never)."""
        async with self._writing() as tx:
            if await _read_key(tx, record.key_id) is not None:
                raise ConflictError(f"Key id '{record.key_id}' exists.", code="key_exists")
            await tx.execute(_KEY_UPSERT, _key_params(record))
            await self._audit(tx, entry)

    async def change_key(self, key_id: str, change: KeyChange) -> KeyRecord:
        """Apply ``change`` to the key as stored now (read, change and write in one
        transaction, so two admins cannot lose each other's change); 404 for an unknown
        id. What ``change`` raises (a 409) aborts the transaction."""
        async with self._writing() as tx:
            current = await _read_key(tx, key_id)
            if current is None:
                raise NotFoundError(f"No API key with id '{key_id}'.", code="key_not_found")
            record, entry = change(current)
            await tx.execute(_KEY_UPSERT, _key_params(record))
            await self._audit(tx, entry)
        return record

    async def import_keys(
        self, records: Iterable[KeyRecord], entry_for: Callable[[KeyRecord], AuditEntry]
    ) -> list[KeyRecord]:
        """Store the keys whose ids are not here yet (one transaction); those imported."""
        async with self.db.transaction(write=False) as tx:
            known = {row[0] for row in await tx.fetchall("SELECT key_id FROM control_keys")}
        fresh = [r for r in records if r.key_id not in known]
        if not fresh:
            return []
        imported = []
        async with self._writing() as tx:
            for record in fresh:
                if await _read_key(tx, record.key_id) is None:  # another replica's import
                    await tx.execute(_KEY_UPSERT, _key_params(record))
                    await self._audit(tx, entry_for(record))
                    imported.append(record)
        return imported

    async def change_tenant(self, name: str, change: TenantChange) -> TenantRecord:
        """Apply ``change`` to the API tenant ``name`` (None when the API never set it),
        in one transaction."""
        async with self._writing() as tx:
            rows = await tx.fetchall(
                "SELECT name, config, created, updated FROM control_tenants WHERE name = ?",
                (name,),
            )
            record, entry = change(_tenant_record(rows[0]) if rows else None)
            await tx.execute(
                _TENANT_UPSERT,
                (
                    record.name,
                    _json.encode(record.config).decode(),
                    record.created,
                    record.updated,
                ),
            )
            await self._audit(tx, entry)
        return record


async def _read_key(tx: Tx, key_id: str) -> KeyRecord | None:
    rows = await tx.fetchall(f"SELECT {_KEYS} FROM control_keys WHERE key_id = ?", (key_id,))
    return _key_record(rows[0]) if rows else None
