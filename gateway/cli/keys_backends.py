"""Where ``switchyard keys`` makes its changes: a running gateway's admin API (``--url``),
the control store the policy file names (``control:``), or the legacy keys file
(``auth.keys_file``, when there is no ``control:``). Each answers with the admin API's key
view (a dict), so the command prints the same whichever it used."""

from __future__ import annotations

import asyncio
import getpass
import time
from collections.abc import Mapping
from typing import Any, Protocol

import httpx
import msgspec

from core.clock import SystemClock
from core.config import Config, relative_to_config
from core.errors import GatewayError
from policies.auth.keys import KeyRecord as FileKeyRecord
from policies.auth.keys import KeysFile, KeysFileError
from policies.control import (
    Catalog,
    ControlPlane,
    ControlStore,
    CreateKey,
    RotateKey,
    open_database,
    public_view,
)

View = dict[str, Any]


class CliError(Exception):
    """A failure to print as it is (no traceback)."""


class KeysBackend(Protocol):
    def create(self, request: CreateKey) -> tuple[str, View]: ...

    def list(self, tenant: str | None) -> list[View]: ...

    def revoke(self, key_id: str) -> View: ...

    def rotate(self, key_id: str, grace_seconds: float) -> tuple[str, View]: ...


def _file_view(record: FileKeyRecord) -> View:
    return {
        "id": record.key_id,
        "tenant": record.tenant,
        "name": record.name,
        "created": record.created,
        "revoked_at": record.revoked_at,
        "expires_at": None,
        "status": "revoked" if record.revoked else "active",
    }


class FileKeys:
    """The keys file (no rotation, expiry, model lists or metadata there)."""

    def __init__(self, config: Config, path: str) -> None:
        self._tenants = config.tenants
        self.keys = KeysFile(relative_to_config(config, path))

    def create(self, request: CreateKey) -> tuple[str, View]:
        if request.tenant not in self._tenants:
            known = ", ".join(sorted(self._tenants)) or "none"
            raise CliError(f"unknown tenant '{request.tenant}' (tenants in the config: {known})")
        if request.allowed_models or request.expires_at or request.metadata or request.limits:
            raise CliError(
                "--models, --expires-at, --meta and limits (--rpm, ...) need a `control:` section"
            )
        try:
            plaintext, record = self.keys.create(request.tenant, request.name, now=time.time())
        except KeysFileError as exc:
            raise CliError(str(exc)) from exc
        return plaintext, _file_view(record)

    def list(self, tenant: str | None) -> list[View]:
        try:
            records = self.keys.list_keys()
        except KeysFileError as exc:
            raise CliError(str(exc)) from exc
        return [_file_view(r) for r in records if tenant is None or r.tenant == tenant]

    def revoke(self, key_id: str) -> View:
        try:
            return _file_view(self.keys.revoke(key_id, now=time.time()))
        except KeyError:
            raise CliError(f"no key with id '{key_id}' in {self.keys.path}") from None
        except KeysFileError as exc:
            raise CliError(str(exc)) from exc

    def rotate(self, key_id: str, grace_seconds: float) -> tuple[str, View]:
        raise CliError("rotate needs a `control:` section (the keys file cannot rotate keys)")


class StoreKeys:
    """The control store, directly (the same checks and audit records as the admin API;
    the actor is ``cli:<user>``)."""

    def __init__(self, config: Config, env: Mapping[str, str]) -> None:
        assert config.control is not None
        self._config = config
        self._env = env
        self._actor = f"cli:{getpass.getuser()}"

    async def _run(self, work: Any) -> Any:
        clock = SystemClock()
        database = open_database(
            self._config.control,  # type: ignore[arg-type]
            self._env,
            lambda path: relative_to_config(self._config, path),
        )
        store = ControlStore(database, clock)
        try:
            await store.open()
            return await work(ControlPlane(store, clock), store)
        except GatewayError as exc:
            raise CliError(exc.message) from exc
        finally:
            await store.aclose()

    def _call(self, work: Any) -> Any:
        return asyncio.run(self._run(work))

    async def _catalog(self, store: ControlStore) -> Catalog:
        tenants = {**self._config.tenants, **{t.name: t.config for t in await store.list_tenants()}}
        return Catalog(
            tenants=tenants,
            models=frozenset(self._config.models),
            providers=frozenset(self._config.providers),
        )

    def create(self, request: CreateKey) -> tuple[str, View]:
        async def work(plane: ControlPlane, store: ControlStore) -> tuple[str, View]:
            catalog = await self._catalog(store)
            secret, record = await plane.create_key(request, catalog, self._actor)
            return secret, public_view(record, time.time())

        result: tuple[str, View] = self._call(work)
        return result

    def list(self, tenant: str | None) -> list[View]:
        async def work(plane: ControlPlane, store: ControlStore) -> list[View]:
            return [public_view(r, time.time()) for r in await plane.list_keys(tenant)]

        result: list[View] = self._call(work)
        return result

    def revoke(self, key_id: str) -> View:
        async def work(plane: ControlPlane, store: ControlStore) -> View:
            return public_view(await plane.revoke_key(key_id, self._actor), time.time())

        result: View = self._call(work)
        return result

    def rotate(self, key_id: str, grace_seconds: float) -> tuple[str, View]:
        async def work(plane: ControlPlane, store: ControlStore) -> tuple[str, View]:
            request = RotateKey(grace_seconds=grace_seconds)
            secret, record = await plane.rotate_key(key_id, request, self._actor)
            return secret, public_view(record, time.time())

        result: tuple[str, View] = self._call(work)
        return result


class ApiKeys:
    """A running gateway's admin API at ``url`` with the admin key ``admin_key``."""

    def __init__(self, url: str, admin_key: str, timeout_s: float = 10.0) -> None:
        self._client = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"authorization": f"Bearer {admin_key}"},
            timeout=timeout_s,
        )

    def _call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        content = msgspec.json.encode(body) if body is not None else None
        query = {k: v for k, v in params.items() if v is not None}
        try:
            answer = self._client.request(method, path, content=content, params=query)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach {self._client.base_url}: {exc}") from exc
        try:
            data = answer.json()
        except ValueError:
            data = None
        if answer.status_code >= 400:
            error = data.get("error", {}) if isinstance(data, dict) else {}
            message = error.get("message") or answer.text[:200]
            raise CliError(f"{answer.status_code}: {message}")
        return data

    def create(self, request: CreateKey) -> tuple[str, View]:
        view = self._call("POST", "/admin/keys", msgspec.to_builtins(request))
        return view.pop("key"), view

    def list(self, tenant: str | None) -> list[View]:
        data: list[View] = self._call("GET", "/admin/keys", tenant=tenant)["data"]
        return data

    def revoke(self, key_id: str) -> View:
        view: View = self._call("POST", f"/admin/keys/{key_id}/revoke")
        return view

    def rotate(self, key_id: str, grace_seconds: float) -> tuple[str, View]:
        body = {"grace_seconds": grace_seconds}
        view = self._call("POST", f"/admin/keys/{key_id}/rotate", body)
        return view.pop("key"), view
