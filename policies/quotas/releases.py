"""Concurrency leases whose release failed, retried until the store takes them.

A ``settle`` that meets an unreachable store would leave the request's lease in the store,
holding one of the tenant's concurrency slots until it expires (``lease_s``, 10 minutes by
default): after a Redis hiccup of a few seconds, every request admitted before it and ended
during it would keep a slot, and a tenant with a small ``concurrency`` would be locked out.

Releasing a lease (``ZREM``) is idempotent, so it is retried whether or not the failed call
reached the store. Counter corrections (actual - estimate) are not retried: they are not
idempotent (a call whose reply was lost may have been applied), and dropping one leaves the
window charged with the estimate, which errs on the safe side and ends with the window.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import structlog

from policies.store.base import MemoryData, Script, Store, StoreUnavailableError, Value

_log = structlog.get_logger("switchyard.quotas")

RELEASE_LUA = """
for i = 1, #KEYS do redis.call('ZREM', KEYS[i], ARGV[1]) end
return 1
"""


def release_python(data: MemoryData, keys: Sequence[str], args: Sequence[Value], now: float) -> Any:
    """The Python twin of ``RELEASE_LUA``."""
    del now
    for key in keys:
        leases = data.get(key)
        if leases is not None:
            leases.pop(str(args[0]), None)
    return 1


RELEASE = Script("quota_release", RELEASE_LUA, release_python)


class PendingReleases:
    """Lease releases waiting for their store. At most ``limit`` are kept (the oldest are
    dropped first: their leases are the nearest to expiring by themselves)."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._pending: OrderedDict[str, tuple[Store, tuple[str, ...]]] = OrderedDict()
        self.dropped = 0
        self.released = 0

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, store: Store, request_id: str, keys: Sequence[str]) -> None:
        if not keys:
            return
        self._pending[request_id] = (store, tuple(keys))
        while len(self._pending) > self.limit:
            self._pending.popitem(last=False)
            self.dropped += 1

    async def retry(self) -> int:
        """Release what waits, oldest first, until the store fails again. Returns how many
        were released. Never raises for store failures."""
        done = 0
        while self._pending:
            request_id, (store, keys) = next(iter(self._pending.items()))
            try:
                await store.run(RELEASE, keys, [request_id])
            except StoreUnavailableError:
                break
            self._pending.pop(request_id, None)
            done += 1
        if done:
            self.released += done
            _log.info("quota.leases_released", released=done, still_pending=len(self._pending))
        return done
