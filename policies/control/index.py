"""What each replica keeps of the control store in memory, and how it stays current.

``ControlIndex`` answers the request path (a dict lookup and one SHA-256: the request never
waits on the store). ``ControlRefresher`` polls the store's change counter every
``poll_interval_s`` and reloads the index when it moved, so a change made through any
replica is enforced by every replica within about ``poll_interval_s`` plus one reload. A
poll or reload that fails or times out keeps the last good index (logged and counted) and
is tried again at the next tick; it never fails a request.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping

import msgspec
import structlog

from core.clock import Clock
from core.config_tenants import TenantConfig
from core.tenancy import Principal
from policies.auth.keys import parse_key_id
from policies.control.records import KeyRecord
from policies.control.store import ControlStore, Snapshot

_log = structlog.get_logger("switchyard")
_json = msgspec.json.Encoder()


def tags_json(metadata: Mapping[str, str]) -> str | None:
    """A key's metadata as the usage row's ``tags``: compact JSON, keys sorted; None when
    there is none."""
    return _json.encode(dict(sorted(metadata.items()))).decode() if metadata else None


class _Entry:
    """A key and the principal it authenticates as (built once per reload)."""

    __slots__ = ("principal", "record")

    def __init__(self, record: KeyRecord) -> None:
        self.record = record
        models = record.allowed_models
        self.principal = Principal(
            tenant=record.tenant,
            key_id=record.key_id,
            via="api_key",
            models=None if models is None else frozenset(models),
            tags=tags_json(record.metadata),
            limits=record.limits,
        )


class ControlIndex:
    """Keys and API tenants as of ``version``; ``clock.wall()`` judges expiry and
    rotation grace periods."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.version = -1  # nothing loaded yet
        self._keys: dict[str, _Entry] = {}
        self.tenants: dict[str, TenantConfig] = {}

    def load(self, snapshot: Snapshot) -> bool:
        """Replace the contents with ``snapshot``; whether the API tenants changed."""
        self._keys = {record.key_id: _Entry(record) for record in snapshot.keys}
        tenants = {record.name: record.config for record in snapshot.tenants}
        changed = tenants != self.tenants
        self.tenants = tenants
        self.version = snapshot.version
        return changed

    def __len__(self) -> int:
        return len(self._keys)

    def record(self, key_id: str) -> KeyRecord | None:
        entry = self._keys.get(key_id)
        return entry.record if entry is not None else None

    def principal(self, key_id: str) -> Principal | None:
        """The principal key ``key_id`` authenticates as now (its models, tags and limits),
        whatever its state: for work it started earlier (a batch's items)."""
        entry = self._keys.get(key_id)
        return entry.principal if entry is not None else None

    def verify(self, plaintext: str) -> Principal | None:
        """The caller this key belongs to, or None: malformed, unknown, revoked, expired,
        a wrong secret, or a rotated-away secret after its grace period."""
        key_id = parse_key_id(plaintext)
        entry = self._keys.get(key_id) if key_id is not None else None
        if entry is None:
            return None
        digest = hashlib.sha256(plaintext.encode()).hexdigest()
        return entry.principal if entry.record.opens(digest, self._clock.wall()) else None


class RefreshStats:
    """What the refresher did, for logs, ``GET /admin/control`` and tests."""

    def __init__(self) -> None:
        self.polls = 0
        self.reloads = 0
        self.failures = 0
        self.last_error: str | None = None
        self.loaded_at: float | None = None  # Unix seconds of the last good reload


class ControlRefresher:
    """Keeps ``index`` current with ``store``. ``on_tenants`` is called (and awaited) after
    a reload that changed the API tenants."""

    def __init__(
        self,
        store: ControlStore,
        index: ControlIndex,
        clock: Clock,
        *,
        poll_interval_s: float = 0.25,
        timeout_s: float = 2.0,
        on_tenants: Callable[[], object] | None = None,
    ) -> None:
        self.store = store
        self.index = index
        self._clock = clock
        self.poll_interval_s = poll_interval_s
        self._timeout_s = timeout_s
        self._on_tenants = on_tenants
        self.stats = RefreshStats()
        self._lock = asyncio.Lock()

    def set_on_tenants(self, on_tenants: Callable[[], object] | None) -> None:
        self._on_tenants = on_tenants

    async def refresh(self, *, force: bool = False) -> bool:
        """Reload the index if the store's counter moved (or ``force``); whether it
        reloaded. Raises what the store raises (``ControlUnavailableError``) or
        ``TimeoutError``; the index is unchanged then."""
        async with self._lock, asyncio.timeout(self._timeout_s):
            self.stats.polls += 1
            if not force and await self.store.version() == self.index.version:
                return False
            snapshot = await self.store.snapshot()
            tenants_changed = self.index.load(snapshot)
        self.stats.reloads += 1
        self.stats.loaded_at = self._clock.wall()
        if tenants_changed and self._on_tenants is not None:
            outcome = self._on_tenants()
            if asyncio.iscoroutine(outcome):
                await outcome
        return True

    async def tick(self) -> None:
        """One poll; a failure is logged and counted, never raised."""
        try:
            await self.refresh()
        except Exception as exc:  # the store is down or slow: keep the last good index
            self.stats.failures += 1
            message = f"{type(exc).__name__}: {exc}"
            if message != self.stats.last_error:  # one line per new problem, not per poll
                _log.warning("control.refresh_failed", error=message)
            self.stats.last_error = message
        else:
            if self.stats.last_error is not None:
                _log.info("control.refresh_recovered", version=self.index.version)
            self.stats.last_error = None

    async def run(self) -> None:
        """Poll forever (cancel to stop)."""
        while True:
            await asyncio.sleep(self.poll_interval_s)
            await self.tick()
