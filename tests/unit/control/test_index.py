"""The in-memory index and its refresher, over a real store and a fake clock: the index
reloads exactly when the change counter moved, answers the request path by itself (expiry
and rotation grace judged by the clock), tells when the API tenants changed, and keeps the
last good view, counted and logged, while the store is unreachable."""

from __future__ import annotations

import msgspec
import psycopg
import pytest

from core.config_tenants import TenantConfig
from policies.control import ControlIndex, ControlRefresher, ControlStore, tags_json
from policies.control.postgres import PostgresDatabase
from policies.control.records import AuditEntry, TenantRecord, new_key, new_secret_for, rotated
from tests.fixtures.postgres_server import TcpProxy

pytestmark = pytest.mark.anyio


async def add(store, **fields):
    plaintext, record = new_key("acme", "ci", store._clock.wall(), **fields)
    await store.create_key(record, AuditEntry("admin", "key.create", record.key_id))
    return plaintext, record


async def test_the_index_reloads_only_when_the_counter_moved(store, clock) -> None:
    index = ControlIndex(clock)
    refresher = ControlRefresher(store, index, clock)
    assert await refresher.refresh() is True  # the first load
    assert await refresher.refresh() is False
    plaintext, record = await add(store)
    assert index.verify(plaintext) is None  # not loaded yet: the store is the truth
    assert await refresher.refresh() is True
    principal = index.verify(plaintext)
    assert principal is not None and (principal.tenant, principal.key_id) == ("acme", record.key_id)
    assert (refresher.stats.polls, refresher.stats.reloads) == (3, 2)
    assert refresher.stats.loaded_at == clock.wall()


async def test_the_request_path_judges_expiry_and_grace_by_the_clock(store, clock) -> None:
    index = ControlIndex(clock)
    refresher = ControlRefresher(store, index, clock)
    plaintext, _ = await add(store, expires_at=clock.wall() + 60)
    old, rotating = await add(store)
    new = new_secret_for(rotating.key_id)
    now = clock.wall()
    await store.change_key(
        rotating.key_id,
        lambda r: (rotated(r, new, now, 30), AuditEntry("admin", "key.rotate", r.key_id)),
    )
    await refresher.refresh()
    assert index.verify(plaintext) and index.verify(old) and index.verify(new)
    clock.advance(30)
    assert index.verify(plaintext) and index.verify(new) and index.verify(old) is None
    clock.advance(30)
    assert index.verify(plaintext) is None and index.verify(new)
    for bad in ("", "sy-", "garbage", f"sy-{rotating.key_id}-wrong", "sy-ffffffffffff-x"):
        assert index.verify(bad) is None


async def test_a_keys_models_and_tags_ride_on_its_principal(store, clock) -> None:
    index = ControlIndex(clock)
    plaintext, _ = await add(store, allowed_models=["chat"], metadata={"z": "1", "a": "2"})
    bare, _ = await add(store)
    await ControlRefresher(store, index, clock).refresh()
    principal = index.verify(plaintext)
    assert principal is not None and principal.models == frozenset({"chat"})
    assert principal.tags == '{"a":"2","z":"1"}' == tags_json({"z": "1", "a": "2"})
    plain = index.verify(bare)
    assert plain is not None and plain.models is None and plain.tags is None


async def test_tenant_changes_are_reported_once(store, clock) -> None:
    calls: list[dict] = []
    index = ControlIndex(clock)

    async def on_tenants() -> None:
        calls.append(dict(index.tenants))

    refresher = ControlRefresher(store, index, clock, on_tenants=on_tenants)
    await refresher.refresh()
    await add(store)
    await refresher.refresh()
    assert calls == []  # a key changed, not a tenant
    config = msgspec.convert({"weight": 2.0}, TenantConfig)
    record = TenantRecord(name="newco", config=config, created=1.0, updated=1.0)
    await store.change_tenant("newco", lambda _: (record, AuditEntry("a", "tenant.create", "n")))
    await refresher.refresh()
    await refresher.refresh()
    assert calls == [{"newco": config}]


async def test_an_unreachable_store_keeps_the_last_good_index(pg_dsn, clock) -> None:
    proxy = await TcpProxy(int(psycopg.conninfo.conninfo_to_dict(pg_dsn).get("port", 5432))).start()
    store = ControlStore(PostgresDatabase(proxy.dsn(pg_dsn), timeout_s=2), clock)
    try:
        await store.open()
        plaintext, _ = await add(store)
        index = ControlIndex(clock)
        refresher = ControlRefresher(store, index, clock, timeout_s=2)
        await refresher.tick()
        assert index.verify(plaintext) is not None
        await proxy.cut()
        await refresher.tick()
        await refresher.tick()
        assert refresher.stats.failures == 2 and refresher.stats.last_error
        assert index.verify(plaintext) is not None  # still served from memory
        await proxy.start()
        await refresher.tick()  # a new connection: the store answers again
        assert refresher.stats.last_error is None and refresher.stats.failures == 2
    finally:
        await store.aclose()
        await proxy.cut()
