"""``ControlPlane``: what an admin may ask, on both store backends. Keys need an existing
tenant and known aliases, sane tags and a future expiry; refused requests change nothing;
tenants are created once, changed by JSON merge patch over the stored record (two admins
at once lose nothing), and checked against the aliases and providers configured."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from core.config_tenants import TenantConfig
from core.errors import InvalidRequestError
from policies.control import (
    Catalog,
    ConflictError,
    ControlPlane,
    CreateKey,
    NotFoundError,
    RotateKey,
    UpdateKey,
)
from policies.control.requests import merge_patch

pytestmark = pytest.mark.anyio
CATALOG = Catalog(
    tenants={"acme": TenantConfig(), "globex": msgspec.convert({"weight": 3}, TenantConfig)},
    models=frozenset({"chat", "json"}),
    providers=frozenset({"oa"}),
)


def key_request(**fields) -> CreateKey:
    return msgspec.convert({"tenant": "acme", **fields}, CreateKey)


@pytest.mark.parametrize(
    ("fields", "error", "code"),
    [
        ({"tenant": "ghost"}, NotFoundError, "tenant_not_found"),
        ({"allowed_models": ["chat", "nope"]}, InvalidRequestError, "model_not_found"),
        ({"expires_at": 1.0}, InvalidRequestError, "expires_in_past"),
        ({"metadata": {"k" * 65: "v"}}, InvalidRequestError, None),
    ],
)
async def test_refused_keys_change_nothing(store, clock, fields, error, code) -> None:
    plane = ControlPlane(store, clock)
    with pytest.raises(error) as info:
        await plane.create_key(key_request(**fields), CATALOG, "admin")
    assert info.value.code == code
    assert await store.version() == 0 and await store.audit() == []


async def test_key_lifecycle_and_its_audit_trail(store, clock) -> None:
    plane = ControlPlane(store, clock)
    expires = msgspec.convert({"expires_at": "2999-01-01T00:00:00+00:00"}, UpdateKey)
    _, record = await plane.create_key(key_request(name="ci"), CATALOG, "alice")
    await plane.update_key(record.key_id, expires, CATALOG, "alice")
    _, rotated = await plane.rotate_key(record.key_id, RotateKey(grace_seconds=10), "bob")
    assert rotated.previous_valid_until == clock.wall() + 10
    assert rotated.expires_at == 32472144000.0
    await plane.revoke_key(record.key_id, "bob")
    with pytest.raises(ConflictError):
        await plane.revoke_key(record.key_id, "bob")
    with pytest.raises(InvalidRequestError):
        await plane.update_key(record.key_id, UpdateKey(), CATALOG, "alice")
    trail = [(a.actor, a.action) for a in await store.audit()]
    assert trail == [
        ("bob", "key.revoke"),
        ("bob", "key.rotate"),
        ("alice", "key.update"),
        ("alice", "key.create"),
    ]
    assert (await plane.get_key(record.key_id)).revoked_at == clock.wall()
    with pytest.raises(NotFoundError):
        await plane.get_key("ffffffffffff")


async def test_tenants_are_created_once_and_checked(store, clock) -> None:
    plane = ControlPlane(store, clock)
    record = await plane.create_tenant("newco", {"limits": {"rpm": 5}}, CATALOG, "admin")
    assert record.config.limits.rpm == 5
    for name in ("acme", "newco"):  # the file's, and one the store has (a stale view)
        catalog = (
            CATALOG
            if name == "acme"
            else Catalog(
                tenants=CATALOG.tenants, models=CATALOG.models, providers=CATALOG.providers
            )
        )
        with pytest.raises(ConflictError):
            await plane.create_tenant(name, {}, catalog, "admin")
    for fields in ({"models": ["nope"]}, {"deny_providers": ["nope"]}, {"weight": 0}, {"x": 1}):
        with pytest.raises(InvalidRequestError):
            await plane.create_tenant("other", fields, CATALOG, "admin")
    assert [t.name for t in await store.list_tenants()] == ["newco"]


async def test_tenant_patches_merge_over_the_stored_record(store, clock) -> None:
    plane = ControlPlane(store, clock)
    await plane.update_tenant("globex", {"limits": {"rpm": 10}}, CATALOG, "admin")
    # both replicas hold the file's view (weight 3, no limits); neither change is lost
    await asyncio.gather(
        plane.update_tenant("globex", {"limits": {"tpm": 100}}, CATALOG, "a"),
        plane.update_tenant("globex", {"models": ["chat"]}, CATALOG, "b"),
    )
    [stored] = await store.list_tenants()
    config = stored.config
    assert (config.weight, config.limits.rpm, config.limits.tpm) == (3.0, 10, 100)
    assert config.models == ["chat"]
    cleared = await plane.update_tenant("globex", {"models": None}, CATALOG, "admin")
    assert cleared.config.models is None and cleared.config.limits.rpm == 10
    with pytest.raises(NotFoundError):
        await plane.update_tenant("ghost", {"weight": 2}, CATALOG, "admin")
    with pytest.raises(InvalidRequestError):
        await plane.update_tenant("globex", {}, CATALOG, "admin")


def test_merge_patch_follows_rfc_7396() -> None:
    target = {"a": 1, "b": {"c": 2, "d": 3}, "e": [1]}
    patch = {"a": None, "b": {"c": None, "x": 1}, "e": [2], "f": {"g": None}}
    assert merge_patch(target, patch) == {"b": {"d": 3, "x": 1}, "e": [2], "f": {}}
    assert merge_patch(target, [1]) == [1]
