"""The control plane inside one gateway process: its store, the in-memory index the request
path reads, the refresher that keeps it current, and the tenants it adds to the policy.

Started once per process (``GatewayState.start``); a reload of the policy file keeps it
(``control:`` changes apply at restart, as ``state:`` and ``ledger:`` do).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import msgspec
import structlog

from core.clock import Clock
from core.config import Config, relative_to_config
from core.tenancy import Principal
from policies.auth.keys import KeysFileError, read_keys
from policies.control import (
    Catalog,
    ControlIndex,
    ControlPlane,
    ControlRefresher,
    ControlStore,
    open_database,
)

_log = structlog.get_logger("switchyard")


class GatewayControl:
    """One process's view of the control store named by ``config.control``."""

    def __init__(self, config: Config, env: Mapping[str, str], clock: Clock) -> None:
        control = config.control
        assert control is not None
        self._config = config
        database = open_database(control, env, lambda path: relative_to_config(config, path))
        self.store = ControlStore(database, clock)
        self.index = ControlIndex(clock)
        self.plane = ControlPlane(self.store, clock)
        self.refresher = ControlRefresher(
            self.store,
            self.index,
            clock,
            poll_interval_s=control.poll_interval_s,
            timeout_s=control.timeout_s,
        )

    def verify(self, plaintext: str) -> Principal | None:
        """The request path's key check (``Authenticator``'s ``control_keys``)."""
        return self.index.verify(plaintext)

    async def start(self) -> None:
        """Create or upgrade the schema, import ``auth.keys_file`` (keys the store lacks)
        and load the index. Raises when the store cannot be opened: a gateway that cannot
        read its keys does not start."""
        applied = await self.store.open()
        if applied:
            _log.info("control.migrated", versions=applied, backend=self.store.db.name)
        await self._import_keys_file()
        await self.refresher.refresh(force=True)
        _log.info("control.loaded", version=self.index.version, keys=len(self.index))

    async def _import_keys_file(self) -> None:
        path = self._config.auth.keys_file
        if not path:
            return
        try:
            records = read_keys(relative_to_config(self._config, path))
        except KeysFileError as exc:
            _log.error("control.keys_file_unreadable", error=str(exc))
            return
        imported = await self.plane.import_keys_file(list(records.values()))
        if imported:
            _log.info("control.keys_imported", keys=len(imported), path=path)

    def on_tenants(self, apply: Callable[[], Awaitable[None]]) -> None:
        """Call ``apply`` whenever a reload changed the API tenants."""
        self.refresher.set_on_tenants(apply)

    async def changed(self) -> None:
        """After a change through this replica: reload now (this replica enforces its own
        change at once; the others within a poll). A failure here is logged: the change
        is committed and the next poll picks it up."""
        await self.refresher.tick()

    def merged(self, config: Config) -> Config:
        """``config`` with the API tenants over its ``tenants:`` (each API tenant replaces
        the policy file's section of the same name as a whole)."""
        if not self.index.tenants:
            return config
        tenants = {**config.tenants, **self.index.tenants}
        return msgspec.structs.replace(config, tenants=tenants)

    @staticmethod
    def catalog(config: Config) -> Catalog:
        """What a change may refer to, in the (merged) ``config`` now serving."""
        return Catalog(
            tenants=config.tenants,
            models=frozenset(config.models),
            providers=frozenset(config.providers),
        )

    async def aclose(self) -> None:
        await self.store.aclose()


def open_control(config: Config, env: Mapping[str, str], clock: Clock) -> GatewayControl | None:
    """The process's control plane, or None when the policy has no ``control:`` section."""
    return GatewayControl(config, env, clock) if config.control is not None else None
