"""A key's own limits in the control plane, on both store backends: stored and read back
(NULL in a database made before they existed: the tenant's ``key_limits`` apply), set,
replaced and cleared by the control plane with their audit records, refused when not
positive (with the field named), carried by the index onto the key's ``Principal``, and
seen by a second replica's index after its next poll."""

from __future__ import annotations

import msgspec
import pytest

from core.config_tenants import Limits, TenantConfig
from core.errors import InvalidRequestError
from policies.control import Catalog, ControlIndex, ControlPlane, ControlRefresher, UpdateKey
from policies.control.database import MIGRATIONS
from policies.control.records import check_limits, edited, new_key, public_view
from policies.control.requests import CreateKey

pytestmark = pytest.mark.anyio
CATALOG = Catalog(
    tenants={"acme": TenantConfig(key_limits=Limits(rpm=100))},
    models=frozenset({"chat"}),
    providers=frozenset({"oa"}),
)
OWN = Limits(rpm=2, usd_per_day=1.5)


def create(**fields) -> CreateKey:
    return msgspec.convert({"tenant": "acme", **fields}, CreateKey)


def update(**fields) -> UpdateKey:
    return msgspec.convert(fields, UpdateKey)


async def test_limits_are_stored_replaced_cleared_and_audited(store, clock) -> None:
    plane = ControlPlane(store, clock)
    _, record = await plane.create_key(create(limits={"rpm": 2, "usd_per_day": 1.5}), CATALOG, "a")
    assert record.limits == OWN and (await store.get_key(record.key_id)).limits == OWN
    raised = await plane.update_key(record.key_id, update(limits={"tpm": 500}), CATALOG, "a")
    assert raised.limits == Limits(tpm=500)  # replaced as a whole, not merged
    assert (await store.get_key(record.key_id)).limits == Limits(tpm=500)
    renamed = await plane.update_key(record.key_id, update(name="x"), CATALOG, "a")
    assert renamed.limits == Limits(tpm=500)  # a PATCH without limits keeps them
    cleared = await plane.update_key(record.key_id, update(limits=None), CATALOG, "a")
    assert cleared.limits is None and (await store.get_key(record.key_id)).limits is None
    audit = await store.audit(target=record.key_id)
    assert [a.details.get("limits", "-") for a in audit] == [
        None,
        "-",
        {"rpm": None, "tpm": 500, "concurrency": None, "usd_per_day": None, "usd_per_month": None},
        {"rpm": 2, "tpm": None, "concurrency": None, "usd_per_day": 1.5, "usd_per_month": None},
    ]
    assert [a.action for a in audit] == ["key.update"] * 3 + ["key.create"]


async def test_keys_without_limits_keep_none_and_empty_limits_mean_unlimited(store, clock):
    plane = ControlPlane(store, clock)
    _, plain = await plane.create_key(create(), CATALOG, "a")
    _, exempt = await plane.create_key(create(limits={}), CATALOG, "a")
    assert (await store.get_key(plain.key_id)).limits is None
    assert (await store.get_key(exempt.key_id)).limits == Limits()
    assert public_view(plain, clock.wall())["limits"] is None
    assert public_view(exempt, clock.wall())["limits"] == dict.fromkeys(Limits.__struct_fields__)


@pytest.mark.parametrize(
    ("limits", "param"),
    [
        (Limits(rpm=0), "limits.rpm"),
        (Limits(tpm=-5), "limits.tpm"),
        (Limits(concurrency=True), "limits.concurrency"),  # type: ignore[arg-type]
        (Limits(usd_per_day=float("nan")), "limits.usd_per_day"),
        (Limits(usd_per_month=float("inf")), "limits.usd_per_month"),
    ],
)
async def test_limits_built_in_code_are_checked_too(store, clock, limits, param) -> None:
    plane = ControlPlane(store, clock)
    with pytest.raises(InvalidRequestError) as info:
        await plane.create_key(CreateKey(tenant="acme", limits=limits), CATALOG, "a")
    assert info.value.param == param and info.value.status == 400
    _, record = await plane.create_key(create(), CATALOG, "a")
    with pytest.raises(InvalidRequestError) as again:
        await plane.update_key(record.key_id, UpdateKey(limits=limits), CATALOG, "a")
    assert again.value.param == param
    assert (await store.get_key(record.key_id)).limits is None
    assert check_limits(limits) == param and check_limits(OWN) is None


@pytest.mark.parametrize(
    "raw",
    [{"rpm": 0}, {"rpm": -1}, {"rpm": 1.5}, {"tpm": "10"}, {"usd_per_day": 0}, {"rps": 3}],
)
def test_the_request_bodies_refuse_bad_limits(raw) -> None:
    for body in ({"tenant": "acme", "limits": raw}, {"limits": raw}):
        kind = CreateKey if "tenant" in body else UpdateKey
        with pytest.raises(msgspec.ValidationError, match=r"\$\.limits"):
            msgspec.convert(body, kind)


def test_edited_sets_limits() -> None:
    _, record = new_key("acme", "k", 1.0)
    assert edited(record, {"limits": OWN}, 2.0).limits == OWN
    assert edited(record, {"limits": None}, 2.0).limits is None


async def test_the_principal_carries_the_keys_limits_to_every_replica(store, clock, make_store):
    plane = ControlPlane(store, clock)
    own, record = await plane.create_key(create(limits={"rpm": 2}), CATALOG, "a")
    tenants, _ = await plane.create_key(create(), CATALOG, "a")
    here, there = ControlIndex(clock), ControlIndex(clock)
    other = make_store()  # the second replica's own connection
    await other.open()
    replicas = [ControlRefresher(store, here, clock), ControlRefresher(other, there, clock)]
    for refresher in replicas:
        await refresher.refresh()
    for index in (here, there):
        assert index.verify(own).limits == Limits(rpm=2)
        assert index.verify(tenants).limits is None
    await plane.update_key(record.key_id, update(limits={"rpm": 50}), CATALOG, "a")
    assert there.verify(own).limits == Limits(rpm=2)  # until its next poll
    assert await replicas[1].refresh() is True
    assert there.verify(own).limits == Limits(rpm=50)


async def test_a_database_from_before_key_limits_is_upgraded_in_place(make_store) -> None:
    store = make_store()
    first_version, first_steps = MIGRATIONS[0]
    async with store.db.transaction(write=True) as tx:  # what the previous release made
        await tx.execute(
            "CREATE TABLE IF NOT EXISTS control_migrations "
            "(version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
        )
        for statement in first_steps:
            await tx.execute(statement.replace("{auto_id}", store.db.auto_id))
        await tx.execute(
            "INSERT INTO control_migrations (version, applied_at) VALUES (?, ?)",
            (first_version, 0.0),
        )
        await tx.execute(
            "INSERT INTO control_keys (key_id, tenant, name, sha256, created, updated, "
            "metadata) VALUES (?, ?, ?, ?, ?, ?, ?)",
            ("0123456789ab", "acme", "old", "0" * 64, 1.0, 1.0, "{}"),
        )
    try:
        assert await store.open() == [version for version, _ in MIGRATIONS[1:]]
        old = await store.get_key("0123456789ab")
        assert old is not None and old.name == "old" and old.limits is None
    finally:
        await store.aclose()
