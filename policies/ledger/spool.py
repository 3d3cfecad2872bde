"""A shared ledger with a local spool: a row is never lost because the shared backend is down.

``SpoolingLedger(primary, spool, clock)`` is a ``Ledger`` over a primary that other
replicas share (``RedisStreamLedger`` or ``PostgresLedger``):

- ``append`` writes to the primary. When that fails (both primaries also fail fast, with
  ``StoreUnavailableError``, for a while after an outage), the row goes to the spool instead
  (a ``SqliteLedger``: WAL, ``synchronous=FULL``, group commit) and ``append`` returns
  normally once the spool has synced it. Any failure of the primary is spooled, not only
  ``StoreUnavailableError``: a Redis that refuses writes (``OOM`` at ``maxmemory``,
  ``MISCONF``), a Postgres that is read-only or full, or a bug in the script must not cost a
  row either; the error is logged. Only when the spool fails too does ``append`` raise (the
  spool's error).
- A background task replays spooled rows into the primary, oldest first (by ``ts``, then
  ``request_id``), in batches, deleting each batch's rows from the spool only after the
  primary acknowledged them. A primary with ``append_many`` (``BatchPrimary``: Postgres)
  takes a whole batch in one transaction; the Redis stream takes one row after the other.
  It starts on the first spooled row, on ``start()``, or on the first ``append`` of a ledger
  whose spool may hold rows from an earlier run (so a restart replays leftovers without a
  manual step); it stops when the spool is empty. While replays fail it retries every
  ``replay_interval_s`` (the wait is real time; whether an attempt is due is read from the
  injected clock, so tests decide when it may retry). ``start()`` also lets such a primary
  ``prepare`` itself (Postgres: connect and migrate its schema); an unreachable one is
  logged, not fatal: rows are spooled until it is back.
- ``rows()`` reads the primary only: a spooled row shows up in exports once it has been
  replayed. Merging the spool in would not make exports available during an outage (the
  primary cannot be read then either) and would need deduplication against the primary.
- ``aclose()`` stops the task, then tries one last replay for at most ``close_timeout_s``;
  what is left stays in the spool for the next ledger on the same file.

Exactly once. A row reaches the primary twice only when a write landed without being
acknowledged (a command or commit that timed out after the server applied it, or a crash
between the primary's acknowledgement and the spool delete). Postgres then skips it for
good (``request_id`` is the primary key). Redis skips a ``request_id`` whose seen-marker
(``ledger:seen:<id>``, ``dedup_ttl_s``, 15 minutes by default) still exists, so the replay
is a no-op unless it comes after the marker expired (an outage, or a process that stays
down, longer than ``dedup_ttl_s``), in which case the stream holds the row twice. Exports
from Redis that must be exact can drop repeated ``request_id``s.

Order and lateness (Redis): a replayed row is older than what other appends put in the
stream since the outage ended, so it gets an ID after the stream's newest entry (see
``policies.ledger.redis_stream``). A row replayed more than the primary's
``max_lateness_s`` (an hour) after its ``ts`` is still in the stream, but queries that set
``end`` miss it. Postgres orders by ``ts`` whenever the row arrives.

Several processes may share one spool file (SQLite locks; deduplication makes concurrent
replays of the same row a no-op). ``aclose`` must come after the last ``append`` returned.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Protocol, runtime_checkable

import structlog

from core.clock import Clock
from core.tenancy import UsageRow
from policies.ledger.base import Ledger
from policies.ledger.sqlite import SqliteLedger
from policies.store.base import StoreUnavailableError

_log = structlog.get_logger("switchyard")


@runtime_checkable
class BatchPrimary(Protocol):
    """What a primary may offer beyond ``Ledger`` (``PostgresLedger`` does)."""

    async def prepare(self) -> None:
        """Get ready to write (connect, migrate); ``StoreUnavailableError`` when down."""
        ...

    async def append_many(self, rows: Sequence[UsageRow]) -> None:
        """Commit ``rows`` durably, in as few transactions as it can."""
        ...


class SpoolingLedger:
    """``Ledger`` on ``primary`` with ``spool`` as its fallback (see the module docstring).
    Both are owned: ``aclose`` closes them (a Redis primary's store stays open)."""

    def __init__(
        self,
        primary: Ledger,
        spool: SqliteLedger,
        clock: Clock,
        *,
        replay_interval_s: float = 1.0,
        batch_rows: int = 500,
        close_timeout_s: float = 5.0,
    ) -> None:
        self.primary = primary
        self.spool = spool
        self.clock = clock
        self.replay_interval_s = replay_interval_s
        self.batch_rows = batch_rows
        self.close_timeout_s = close_timeout_s
        self.spooled = 0  # rows this ledger sent to the spool
        self.replayed = 0  # spooled rows (of any run) it moved into the primary
        self._task: asyncio.Task[None] | None = None
        # True until a replay found the spool empty: rows of an earlier run may be there.
        self._maybe_pending = True
        self._generation = 0  # bumped on every spooled row, so the task never exits past one
        self._due = clock.now()  # clock time from which the next replay attempt may run
        self._replaying = asyncio.Lock()
        self._spooling = False  # for logging only the transitions
        self._closed = False

    async def start(self) -> None:
        """Prepare the primary (when it can: ``BatchPrimary``) and replay what an earlier
        run left in the spool, in the background. An unreachable primary is logged."""
        if isinstance(self.primary, BatchPrimary):
            try:
                await self.primary.prepare()
            except StoreUnavailableError as exc:
                _log.warning("ledger.primary_unreachable", error=str(exc))
        self._ensure_task()

    async def append(self, row: UsageRow) -> None:
        """Return once the primary or, failing that, the spool holds ``row`` durably.
        Raises only when the spool fails too (or the ledger is closed)."""
        if self._closed:
            raise RuntimeError("the ledger is closed")
        if self._maybe_pending:
            self._ensure_task()
        try:
            await self.primary.append(row)
            return
        except Exception as exc:  # every failure: the spool keeps the row
            error = exc
        await self._spool(row, error)

    def rows(
        self, *, tenant: str | None = None, start: float | None = None, end: float | None = None
    ) -> AsyncIterator[UsageRow]:
        """The primary's rows (spooled rows appear once replayed); raises
        ``StoreUnavailableError`` while the primary is unreachable."""
        return self.primary.rows(tenant=tenant, start=start, end=end)

    async def replay(self) -> int:
        """Move spooled rows into the primary, oldest first, until the spool is empty;
        returns how many moved. Raises the first error of the primary or the spool; rows
        acknowledged before it are deleted from the spool, the rest stay."""
        async with self._replaying:
            moved = 0
            while True:
                batch = await self.spool.oldest(self.batch_rows)
                if not batch:
                    return moved
                done: list[str] = []
                try:
                    await self._to_primary(batch, done)
                finally:
                    # Deleted only once acknowledged: a crash before this line means these
                    # rows are appended again later, which deduplication makes a no-op.
                    if done:
                        await self.spool.delete(done)
                        moved += len(done)
                        self.replayed += len(done)

    async def _to_primary(self, batch: list[UsageRow], done: list[str]) -> None:
        """Append ``batch`` to the primary, adding to ``done`` the request_ids it
        acknowledged. One after the other, stopping at the first error; a ``BatchPrimary``
        takes the batch at once, and when it refuses some row for a reason other than an
        outage, every row is tried on its own, so one row it will never take (a bug)
        does not hold up the rows behind it: the first such error is raised at the end."""
        if isinstance(self.primary, BatchPrimary):
            try:
                await self.primary.append_many(batch)
            except StoreUnavailableError:
                raise
            except Exception as exc:
                refused: Exception = exc
            else:
                done.extend(row.request_id for row in batch)
                return
            for row in batch:
                try:
                    await self.primary.append(row)
                except StoreUnavailableError:
                    raise
                except Exception:
                    continue
                done.append(row.request_id)
            raise refused
        for row in batch:
            await self.primary.append(row)
            done.append(row.request_id)

    async def aclose(self) -> None:
        """Stop replaying, try one last replay (at most ``close_timeout_s``), close the
        spool. Rows that could not be replayed stay in the spool file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._maybe_pending:
            try:
                async with asyncio.timeout(self.close_timeout_s):
                    await self._attempt()
            except TimeoutError:
                _log.warning("ledger.spool_left", reason="close timeout")
        await self.spool.aclose()
        await self.primary.aclose()

    async def _spool(self, row: UsageRow, error: Exception) -> None:
        await self.spool.append(row)
        self.spooled += 1
        self._generation += 1
        self._maybe_pending = True
        if not self._spooling:
            self._spooling = True
            _log.warning("ledger.spooling", error=str(error), spool=str(self.spool.path))
        self._ensure_task()

    def _ensure_task(self) -> None:
        if self._closed or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.create_task(self._run(), name="ledger-spool-replay")

    async def _run(self) -> None:
        """Replay until the spool is empty and no row was spooled during the last pass."""
        while True:
            if self.clock.now() >= self._due:
                generation = self._generation
                if await self._attempt():
                    if generation == self._generation:
                        self._maybe_pending = False
                        return
                    continue  # rows were spooled meanwhile: look again
                self._due = self.clock.now() + self.replay_interval_s
            await asyncio.sleep(self.replay_interval_s)

    async def _attempt(self) -> bool:
        """One ``replay``; True when it emptied the spool. Errors are logged, not raised."""
        try:
            moved = await self.replay()
        except StoreUnavailableError:  # still down: ``ledger.spooling`` has said so
            return False
        except Exception:
            _log.exception("ledger.replay_failed")
            return False
        if moved or self._spooling:
            _log.info("ledger.spool_replayed", rows=moved)
        self._spooling = False
        return True
