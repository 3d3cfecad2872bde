"""``ControlStore`` on both backends (SQLite file, PostgreSQL database): the versioned
schema is created once and upgrades idempotently, every change moves the change counter and
writes its audit record in the same transaction (a refused change does neither), changes
through two connections at once lose nothing, and imports of the keys file are idempotent."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from core.config_tenants import TenantConfig
from policies.control import ConflictError, NotFoundError, SchemaTooNewError
from policies.control.database import MIGRATIONS
from policies.control.records import AuditEntry, TenantRecord, new_key, revoked

pytestmark = pytest.mark.anyio
VERSIONS = [version for version, _ in MIGRATIONS]


async def add(store, tenant: str = "acme", name: str = "k", at: float = 1.0):
    plaintext, record = new_key(tenant, name, at)
    await store.create_key(record, AuditEntry("admin", "key.create", record.key_id))
    return plaintext, record


async def test_the_schema_is_created_once_and_reopening_is_a_no_op(store, make_store) -> None:
    assert await store.open() == []
    other = make_store()
    assert await other.open() == []  # a second process on the same database
    assert await store.version() == 0
    async with store.db.transaction(write=False) as tx:
        rows = await tx.fetchall("SELECT version FROM control_migrations")
    assert sorted(rows) == [(version,) for version in VERSIONS]


async def test_replicas_opening_a_new_database_at_once_migrate_it_once(make_store) -> None:
    stores = [make_store() for _ in range(3)]
    applied = await asyncio.gather(*(s.open() for s in stores))
    assert sorted(applied) == [[], [], VERSIONS]


async def test_a_schema_newer_than_the_code_is_refused(store, make_store) -> None:
    async with store.db.transaction(write=True) as tx:
        await tx.execute(
            "INSERT INTO control_migrations (version, applied_at) VALUES (?, ?)", (99, 0.0)
        )
    with pytest.raises(SchemaTooNewError, match="version 99"):
        await make_store().open()


async def test_every_change_moves_the_counter_and_leaves_one_audit_record(store) -> None:
    _, record = await add(store)
    assert await store.version() == 1

    def revoke(current):
        return revoked(current, 2.0), AuditEntry("ops", "key.revoke", current.key_id, {"why": 1})

    after = await store.change_key(record.key_id, revoke)
    assert after.revoked_at == 2.0 and await store.version() == 2
    with pytest.raises(ConflictError):
        await store.change_key(record.key_id, revoke)  # refused: rolled back
    assert await store.version() == 2
    audit = await store.audit()
    assert [(a.actor, a.action, a.details) for a in audit] == [
        ("ops", "key.revoke", {"why": 1}),
        ("admin", "key.create", {}),
    ]
    assert audit[0].id > audit[1].id and audit[0].at == store._clock.wall()
    stored = await store.get_key(record.key_id)
    assert stored is not None and stored.revoked_at == 2.0


async def test_unknown_keys_and_taken_ids_are_errors_that_change_nothing(store) -> None:
    with pytest.raises(NotFoundError) as missing:
        await store.change_key("ffffffffffff", lambda r: (r, AuditEntry("a", "b", "c")))
    assert missing.value.status == 404
    _, record = await add(store)
    with pytest.raises(ConflictError):
        await store.create_key(record, AuditEntry("admin", "key.create", record.key_id))
    assert await store.version() == 1 and len(await store.audit()) == 1
    assert await store.get_key("ffffffffffff") is None


async def test_records_round_trip_through_the_database(store) -> None:
    _, record = new_key(
        "acme", "ci", 5.0, expires_at=99.5, allowed_models=["a", "b"], metadata={"t": "é"}
    )
    await store.create_key(record, AuditEntry("admin", "key.create", record.key_id))
    assert await store.get_key(record.key_id) == record
    _, other = await add(store, tenant="globex", at=6.0)
    assert [r.key_id for r in await store.list_keys()] == [record.key_id, other.key_id]
    assert await store.list_keys("globex") == [other]
    snapshot = await store.snapshot()
    assert snapshot.version == 2 and {r.key_id for r in snapshot.keys} == {
        record.key_id,
        other.key_id,
    }


async def test_audit_filters_and_pages(store) -> None:
    records = [(await add(store, name=str(i)))[1] for i in range(5)]
    page = await store.audit(limit=2)
    assert [a.target for a in page] == [records[4].key_id, records[3].key_id]
    rest = await store.audit(limit=10, before=page[-1].id)
    assert [a.target for a in rest] == [r.key_id for r in reversed(records[:3])]
    assert [a.target for a in await store.audit(target=records[1].key_id)] == [records[1].key_id]
    assert await store.audit(action="key.revoke") == []


async def test_concurrent_changes_through_two_connections_lose_nothing(store, make_store) -> None:
    other = make_store()
    await other.open()
    _, record = await add(store)

    def tag(i: int):
        def change(current):
            metadata = {**current.metadata, f"k{i}": "v"}
            return (
                msgspec.structs.replace(current, metadata=metadata),
                AuditEntry("admin", "key.update", current.key_id),
            )

        return change

    await asyncio.gather(
        *((store if i % 2 else other).change_key(record.key_id, tag(i)) for i in range(20))
    )
    final = await store.get_key(record.key_id)
    assert final is not None and len(final.metadata) == 20
    assert await store.version() == 21 and len(await store.audit(limit=100)) == 21


async def test_importing_the_keys_file_is_idempotent(store, make_store) -> None:
    _, first = new_key("acme", "a", 1.0)
    _, second = new_key("acme", "b", 1.0)

    def entry(record):
        return AuditEntry("keys_file", "key.import", record.key_id)

    assert await store.import_keys([first], entry) == [first]
    other = make_store()
    await other.open()
    imported = await asyncio.gather(
        store.import_keys([first, second], entry), other.import_keys([first, second], entry)
    )
    assert sorted(len(batch) for batch in imported) == [0, 1]
    assert {r.key_id for r in await store.list_keys()} == {first.key_id, second.key_id}
    assert len(await store.audit(action="key.import")) == 2


async def test_tenants_are_stored_whole(store) -> None:
    config = msgspec.convert({"limits": {"rpm": 5}, "models": ["chat"]}, TenantConfig)

    def create(current):
        assert current is None
        record = TenantRecord(name="newco", config=config, created=1.0, updated=1.0)
        return record, AuditEntry("admin", "tenant.create", "newco")

    await store.change_tenant("newco", create)
    [stored] = await store.list_tenants()
    assert stored.config == config and stored.created == 1.0
    snapshot = await store.snapshot()
    assert snapshot.tenants == [stored] and snapshot.version == 1
