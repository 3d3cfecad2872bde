"""The shared usage ledger: Redis Streams, written by every gateway replica.

Keys (all under the store's prefix):

- ``ledger``: every row, one entry each, field ``row`` = the row as msgspec JSON (JSON so an
  operator can read it with ``redis-cli XRANGE``);
- ``ledger:tenant:<tenant>``: the same entry again for rows that have a tenant, so an export
  for one tenant reads only that tenant's rows instead of scanning every tenant's. The cost
  is a second copy of each row, which we accept: exports by tenant are the common case;
- ``ledger:seen:<request_id>``: a marker that lives ``dedup_ttl_s`` so a retried append of
  the same request (e.g. after a timeout whose write did land) is not counted twice.

One Lua script writes all three, so a row is in both streams or in neither. (The keys are
in different hash slots: Redis Cluster is not supported for the ledger.)

Stream IDs come from the row time: ``<ts in ms>-*``. IDs must grow, and rows arrive a little
out of order (``ts`` is when a request started; rows are appended when it ends), so a row
older than the stream's newest entry gets the next ID after that entry instead. Either way an
entry's ID is never earlier than its row's ``ts``, and later by at most how late the row was
appended. So ``rows(start=...)`` starts its XRANGE at ``start``, and ``rows(end=...)`` reads
up to ``end + max_lateness_s`` and filters on ``ts``; a row appended more than
``max_lateness_s`` after its ``ts`` would be missed by queries that set ``end``.
Order: rows come in stream order, which is ``ts`` order except for such late appends.

Trimming: ``maxlen`` None (the default) never trims: trimming deletes ledger rows. When set,
each stream is trimmed with ``MAXLEN ~ maxlen`` (approximate: at least ``maxlen`` entries are
kept, cheaply). Durability is Redis' own: run it with ``appendonly yes`` (and
``appendfsync always`` to lose nothing on a power cut) if the ledger must survive a restart.
Outages raise ``StoreUnavailableError`` (through ``RedisStore.guard``).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec

from core.tenancy import UsageRow
from policies.ledger.base import PAGE_ROWS, matches
from policies.store.base import MemoryData, Script, Value
from policies.store.redis import RedisStore

# KEYS: global stream, seen marker, [tenant stream]
# ARGV: row time in ms, encoded row, maxlen (0 = never trim), seen marker TTL in ms
_APPEND_LUA = """
-- A script is atomic but not transactional: mark the row seen only after both XADDs,
-- so a failure in between leaves nothing that would make a retry look like a duplicate.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
local function last_ms(key)
  local info = redis.call('XINFO', 'STREAM', key)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then
      return string.match(info[i + 1], '^(%d+)-')
    end
  end
end
local function add(key)
  local args = {'XADD', key}
  if tonumber(ARGV[3]) > 0 then
    args[#args + 1] = 'MAXLEN'
    args[#args + 1] = '~'
    args[#args + 1] = ARGV[3]
  end
  local n = #args
  args[n + 1] = ARGV[1] .. '-*'
  args[n + 2] = 'row'
  args[n + 3] = ARGV[2]
  local added = redis.pcall(unpack(args))
  if type(added) == 'table' and added.err then
    -- older than the stream's newest entry: take the next ID after it instead
    args[n + 1] = last_ms(key) .. '-*'
    added = redis.call(unpack(args))
  end
  return added
end
add(KEYS[1])
if KEYS[3] then
  add(KEYS[3])
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[4])
return 1
"""


def _no_memory_twin(
    data: MemoryData, keys: Sequence[str], args: Sequence[Value], now: float
) -> Any:
    raise NotImplementedError("the Redis stream ledger needs the Redis store")


APPEND = Script("ledger_append", _APPEND_LUA, _no_memory_twin)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(UsageRow)


class RedisStreamLedger:
    """``Ledger`` on Redis Streams (see the module docstring). The ``store`` is borrowed:
    ``aclose`` does not close it."""

    def __init__(
        self,
        store: RedisStore,
        *,
        maxlen: int | None = None,
        page_rows: int = PAGE_ROWS,
        dedup_ttl_s: float = 900.0,
        max_lateness_s: float = 3600.0,
        max_in_flight: int = 32,
    ) -> None:
        self.store = store
        self.maxlen = maxlen
        self.page_rows = page_rows
        self.dedup_ttl_s = dedup_ttl_s
        self.max_lateness_s = max_lateness_s
        # Each append holds one pooled connection while it runs; a burst of requests must
        # not take them all (redis-py's pool raises beyond its size, which the store reports
        # as an outage), so appends beyond this many wait their turn.
        self._in_flight = asyncio.Semaphore(max_in_flight)

    @staticmethod
    def stream_name(tenant: str | None = None) -> str:
        """The stream's key (before the store's prefix): all rows, or one tenant's."""
        return "ledger" if tenant is None else f"ledger:tenant:{tenant}"

    async def append(self, row: UsageRow) -> None:
        """Return once Redis has added the row to its streams (a duplicate request_id
        within ``dedup_ttl_s`` is skipped)."""
        keys = [self.stream_name(), f"ledger:seen:{row.request_id}"]
        if row.tenant is not None:
            keys.append(self.stream_name(row.tenant))
        args: list[Value] = [
            math.floor(row.ts * 1000),
            _encoder.encode(row),
            self.maxlen or 0,
            max(1, round(self.dedup_ttl_s * 1000)),
        ]
        async with self._in_flight:
            await self.store.run(APPEND, keys, args)

    async def rows(
        self, *, tenant: str | None = None, start: float | None = None, end: float | None = None
    ) -> AsyncIterator[UsageRow]:
        """Matching rows in stream order, read with XRANGE ``page_rows`` at a time; a
        ``tenant`` reads that tenant's stream only."""
        key = self.store.key(self.stream_name(tenant))
        low = "-" if start is None else str(math.floor(start * 1000))
        high = "+" if end is None else str(math.ceil((end + self.max_lateness_s) * 1000))
        while True:
            async with self.store.guard():
                found = await self.store.client.xrange(key, low, high, count=self.page_rows)
            page: list[Any] = list(found or ())
            for _, fields in page:
                row = _decoder.decode(fields[b"row"])
                if matches(row, tenant, start, end):
                    yield row
            if len(page) < self.page_rows:
                return
            last = page[-1][0]
            low = "(" + (last.decode() if isinstance(last, bytes) else str(last))

    async def aclose(self) -> None:
        """Nothing is buffered: every append returned after Redis took it."""
