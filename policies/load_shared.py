"""Target load shared by every gateway replica through the ``Store``.

``TargetLoad`` (``policies.load``) counts the requests THIS process holds at each target.
With several replicas in front of one upstream, each sees only its own share: a 4-slot box
with 3 replicas sending 5 each reads "5 in flight" everywhere while it holds 15.
``SharedTargetLoad`` adds what the other replicas hold, as last heard from the store.

The request path never waits for the store: ``enter``/``leave``/``count`` are synchronous
and answer from the local counts plus a snapshot of the other replicas' sums. A background
task (``start``) runs ``sync`` every ``publish_every_s``: ONE script call that publishes
this replica's counts and reads the others' sums for every known label.

Key layout (keys without the store's prefix, so ``switchyard:load:{label}`` on Redis): one
hash per target label, field = replica id, value = ``"{count} {published_at}"``
(``published_at`` is the store's ``now()``, wall-clock seconds, passed in ARGV as every
script does). A replica publishes the labels it holds and those it held since its last
publish, so a label it no longer holds is published once as zero (its field is deleted).
An entry older than ``ttl_s`` is not counted and is deleted when next seen; a key expires
``ttl_s`` after its last non-zero publish, so a dead replica's counts vanish.

When the store is unreachable (``StoreUnavailableError``) the counts are local only (the
others read as 0), and the failure is logged once per outage, as the breakers do; the next
successful sync brings the others back and republishes whatever this replica could not.
The others' sums are also dropped when the last successful sync is older than ``ttl_s``
on the clock's monotonic time (a stalled loop must not leave a stale view forever).

SYNC   KEYS: one key per label.  ARGV: now, ttl_s, replica id, then per key either this
       replica's count (a decimal integer; "0" deletes its field) or "-" (read only).
       Returns per key the sum of the OTHER replicas' fresh counts (integers).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import structlog

from core.clock import Clock
from policies.load import TargetLoad
from policies.store.base import MemoryData, Script, Store, StoreUnavailableError, Value

KEY_PREFIX = "load:"
READ_ONLY = "-"
_log = structlog.get_logger("switchyard")

SYNC_LUA = """
local now, ttl, me = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local px = math.ceil(ttl * 1000)
local out = {}
for i = 1, #KEYS do
  local key, mine = KEYS[i], ARGV[3 + i]
  if mine ~= '-' then
    if tonumber(mine) > 0 then
      redis.call('HSET', key, me, mine .. ' ' .. ARGV[1])
      redis.call('PEXPIRE', key, px)
    else
      redis.call('HDEL', key, me)
    end
  end
  local sum, stale = 0, {}
  local raw = redis.call('HGETALL', key)
  for j = 1, #raw, 2 do
    local who = raw[j]
    if who ~= me then
      local n, at = string.match(raw[j + 1], '^(%S+) (%S+)$')
      n, at = tonumber(n), tonumber(at)
      if n and at and now - at < ttl then
        sum = sum + n
      else
        stale[#stale + 1] = who
      end
    end
  end
  if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  out[i] = sum
end
return out
"""


def _text(value: Value) -> str:
    """An ARGV value as Redis receives it (redis-py sends str(int), repr(float))."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _number(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _sync_python(data: MemoryData, keys: Sequence[str], args: Sequence[Value], now: float) -> Any:
    del now  # the caller's time travels in ARGV[1] on both backends
    stamp = _text(args[0])
    at_now, ttl, me = float(stamp), float(args[1]), _text(args[2])
    out: list[int] = []
    for i, key in enumerate(keys):
        fields: dict[str, str] = dict(data.get(key) or {})
        mine = _text(args[3 + i])
        wrote = False
        if mine != READ_ONLY:
            if int(mine) > 0:
                fields[me] = f"{mine} {stamp}"
                wrote = True
            else:
                fields.pop(me, None)
        total = 0.0
        for who, value in list(fields.items()):
            if who == me:
                continue
            n, at = _parse_entry(value)
            if n is not None and at is not None and at_now - at < ttl:
                total += n
            else:
                del fields[who]
        if fields:
            data.set(key, fields)  # keeps the key's TTL, as HSET/HDEL do
            if wrote:
                data.expire(key, ttl)
        else:
            data.delete(key)  # Redis drops an emptied hash
        out.append(int(total))
    return out


def _parse_entry(value: str) -> tuple[float | None, float | None]:
    parts = value.split(" ")
    if len(parts) != 2 or not all(parts):
        return None, None
    return _number(parts[0]), _number(parts[1])


SYNC = Script("load_sync", SYNC_LUA, _sync_python)


def sync_args(
    now: float, ttl_s: float, replica_id: str, published: Sequence[int | None]
) -> list[Value]:
    """ARGV for SYNC: ``published`` holds, per key, this replica's count or None (read only)."""
    return [
        repr(float(now)),
        repr(float(ttl_s)),
        replica_id,
        *(READ_ONLY if n is None else str(max(0, n)) for n in published),
    ]


def default_replica_id() -> str:
    """A replica id unique per process: host, pid and a random suffix (a restarted process
    must not inherit the fields of the one before it)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class SharedTargetLoad:
    """``TargetLoad`` plus the other replicas' counts (see the module docstring). Call
    ``start()`` to run the background sync and ``aclose()`` to stop it (it publishes a last
    time, so a replica shutting down clears its counts at once)."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        replica_id: str,
        publish_every_s: float = 0.5,
        ttl_s: float = 5.0,
    ) -> None:
        if publish_every_s <= 0 or ttl_s <= 0:
            raise ValueError("publish_every_s and ttl_s must be positive")
        if not replica_id or " " in replica_id:
            raise ValueError("replica_id must be a non-empty string without spaces")
        self._store = store
        self._clock = clock
        self.replica_id = replica_id
        self.publish_every_s = publish_every_s
        self.ttl_s = ttl_s
        self._local = TargetLoad()  # the requests this process holds
        self._dirty: set[str] = set()  # labels entered or left since the last publish
        self._labels: dict[str, None] = {}  # every label to read (insertion-ordered set)
        self._others: dict[str, int] = {}  # label -> other replicas' sum at the last sync
        self._synced_at: float | None = None  # clock.now() of the last successful sync
        self._task: asyncio.Task[None] | None = None
        self.store_down = False
        self.store_failures = 0

    @staticmethod
    def key(label: str) -> str:
        return KEY_PREFIX + label

    def track(self, labels: Iterable[str]) -> None:
        """Read exactly these labels from now on, and those this process still holds calls
        on or has yet to publish (the gateway passes every label of each new runtime, so a
        target this replica never used still shows what the others hold there, and one that
        discovery removed stops being read once its calls here ended and were published)."""
        # held here, or left since the last publish (its zero must still be published)
        held = [k for k in self._labels if self._local.count(k) or k in self._dirty]
        self._labels = dict.fromkeys([*labels, *held])
        self._others = {k: v for k, v in self._others.items() if k in self._labels}

    # The request path: no I/O.

    def enter(self, label: str) -> int:
        """Hold ``label`` for one more request; returns the count before it (this
        replica's and the others'), what its TTFT sample is filed under."""
        before = self._local.enter(label)
        self._dirty.add(label)
        self._labels[label] = None
        return before + self.others(label)

    def leave(self, label: str) -> None:
        self._local.leave(label)
        self._dirty.add(label)

    def count(self, label: str) -> int:
        """Requests at ``label`` across replicas: this one's now plus the others' as of the
        last sync (local only while the store is down or the last sync is too old)."""
        return self._local.count(label) + self.others(label)

    def local_count(self, label: str) -> int:
        return self._local.count(label)

    def others(self, label: str) -> int:
        """The other replicas' count at ``label`` at the last sync, 0 when unknown/stale."""
        if self._synced_at is None or self._clock.now() - self._synced_at > self.ttl_s:
            return 0
        return self._others.get(label, 0)

    # The background side.

    async def sync(self) -> None:
        """Publish this replica's counts and read the others' (one store call)."""
        labels = list(self._labels)
        if not labels:
            return
        dirty, self._dirty = self._dirty, set()
        published = [
            self._local.count(label) if self._local.count(label) or label in dirty else None
            for label in labels
        ]
        args = sync_args(self._store.now(), self.ttl_s, self.replica_id, published)
        try:
            answer = await self._store.run(SYNC, [self.key(label) for label in labels], args)
        except StoreUnavailableError as exc:
            self._dirty |= dirty  # publish them (zeros included) once the store is back
            self._down(exc)
            return
        except BaseException:
            self._dirty |= dirty
            raise
        self._up()
        self._others = {
            label: int(n) for label, n in zip(labels, answer, strict=True) if int(n) > 0
        }
        self._synced_at = self._clock.now()

    async def _sync_forever(self) -> None:
        while True:
            await asyncio.sleep(self.publish_every_s)
            try:
                await self.sync()
            except Exception:  # a bug must not stop the sync loop for good
                _log.exception("load.sync_failed")

    async def start(self) -> None:
        """Start the background sync (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._sync_forever())

    async def aclose(self) -> None:
        """Stop the background sync, then publish once more (best effort)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self.sync()
        except Exception:
            _log.exception("load.sync_failed")

    def _down(self, exc: StoreUnavailableError) -> None:
        self.store_failures += 1
        self._others = {}
        self._synced_at = None
        if not self.store_down:
            self.store_down = True
            _log.warning("load.store_unavailable", error=str(exc), fallback="local")

    def _up(self) -> None:
        if self.store_down:
            self.store_down = False
            _log.info("load.store_recovered")
