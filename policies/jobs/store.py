"""``JobStore``: the async face of the job store, on SQLite (one host) or PostgreSQL (a
fleet); ``db.Backend`` says which, and nothing above this module cares.

Every operation runs in one worker thread that owns the connection (SQLite serialises
writers anyway; one thread keeps the event loop off disk and network waits), in its own
transaction; the store's functions are synchronous and shared by both backends. Times
come from the injected clock's ``wall()``: leases are compared across processes, so they
must be Unix time, not one process's monotonic clock.

Outages (Postgres): a call that finds the database unreachable (``Backend.unreachable``)
logs ``batch.store_unreachable`` with the reason, raises ``JobStoreUnavailableError`` (a
503 for the routes, whose message does not name the database; the runner logs it and
tries again) and drops its connection; for ``retry_interval_s`` on the clock's ``now()`` every
call then fails the same way at once, without network waits piling up in the worker
thread; the next call after that reconnects. Nothing was written by a call that failed
(each is one transaction); a COMMIT whose answer was lost may have landed, which every
step tolerates (they are guarded by the state they expect). Other errors propagate, and a
connection they left unusable is replaced.

Caller-facing methods take the ``Principal`` and scope every query to its tenant
(``batches.tenant_key``); the runner's methods work across tenants. ``retention_s`` and
``webhooks`` (``batch.webhooks``: which events to queue in the outbox, and for whom) are
read at each call, so the runner can keep them current with the config.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

import structlog

from core.clock import Clock
from core.config_batch import WebhookConfig
from core.tenancy import Principal
from policies.jobs import batches, files, finalize, outbox, remote, work
from policies.jobs.batches import Pending, tenant_key
from policies.jobs.db import Backend, Db
from policies.jobs.errors import JobStoreUnavailableError
from policies.jobs.jsonl import Request
from policies.jobs.objects import (
    Batch,
    BatchCreate,
    BatchError,
    BatchList,
    FileList,
    FileObject,
)
from policies.jobs.outbox import Delivery, DeliveryRecord
from policies.jobs.remote import Outcome, RemoteClaim
from policies.jobs.schema import SqliteJobs
from policies.jobs.usage import NO_USAGE, ItemUsage
from policies.jobs.work import Claim

T = TypeVar("T")
_log = structlog.get_logger("switchyard")


class JobStore:
    """Files, batches and items in ``where``: a SQLite file's path (created if needed) or
    a ``Backend`` (``postgres.PostgresJobs``)."""

    def __init__(
        self,
        where: Path | Backend,
        clock: Clock,
        *,
        retention_s: float,
        retry_interval_s: float = 1.0,
    ) -> None:
        self.backend: Backend = SqliteJobs(where) if isinstance(where, Path) else where
        self.path = where if isinstance(where, Path) else None  # the SQLite file, if any
        self.clock = clock
        self.retention_s = retention_s
        self.retry_interval_s = retry_interval_s
        self.webhooks: Mapping[str, WebhookConfig] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="job-store")
        self._db: Db | None = None
        self._down: tuple[float, str] | None = None  # (until, why): failing fast

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, partial(self._run, fn, args, kwargs))

    def _run(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        if self._down is not None and self.clock.now() < self._down[0]:
            raise self._unavailable(self._down[1])
        try:
            if self._db is None:
                self._db = self.backend.open()
            return fn(self._db, *args, **kwargs)
        except Exception as exc:
            if self._db is not None and not self._db.usable():
                self._close_db()
            reason = self.backend.unreachable(exc)
            if reason is None:
                raise
            self._close_db()
            self._down = (self.clock.now() + self.retry_interval_s, reason)
            _log.warning("batch.store_unreachable", error=reason)
            raise self._unavailable(reason) from exc

    def _unavailable(self, reason: str) -> JobStoreUnavailableError:
        error = JobStoreUnavailableError(
            "The batch job store is unreachable; try again shortly.",
            retry_after=self.retry_interval_s,
        )
        error.reason = reason  # for the logs: it names the database's host and port
        return error

    def _close_db(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(Exception):  # thrown away: nothing to save
                db.close()

    async def open(self) -> None:
        """Connect and bring the schema up to date now (so a bad path fails at start).
        ``JobStoreUnavailableError`` when the database cannot be reached."""
        await self._call(lambda db: None)

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self._close_db)
        self._pool.shutdown(wait=True)

    def _expiry(self, now: float, seconds: float | None) -> int:
        return int(now + min(self.retention_s, seconds or self.retention_s))

    # -- files (the caller's own) ---------------------------------------------------------

    async def add_file(
        self,
        principal: Principal,
        *,
        filename: str,
        purpose: str,
        content: bytes,
        expires_after_s: int | None = None,
    ) -> FileObject:
        now = self.clock.wall()
        return await self._call(
            files.add_file,
            tenant=tenant_key(principal),
            filename=filename,
            purpose=purpose,
            content=content,
            now=now,
            expires_at=self._expiry(now, expires_after_s),
        )

    async def file(self, principal: Principal, file_id: str) -> FileObject | None:
        return await self._call(files.get_file, tenant_key(principal), file_id, self.clock.wall())

    async def content(self, principal: Principal, file_id: str) -> tuple[FileObject, bytes] | None:
        now = self.clock.wall()
        return await self._call(files.file_content, tenant_key(principal), file_id, now)

    async def files(
        self,
        principal: Principal,
        *,
        after: str | None = None,
        limit: int = 10_000,
        order: Literal["asc", "desc"] = "desc",
        purpose: str | None = None,
    ) -> FileList:
        """Raises ``UnknownCursor`` when ``after`` is not one of the tenant's files."""
        return await self._call(
            files.list_files,
            tenant_key(principal),
            self.clock.wall(),
            after=after,
            limit=limit,
            order=order,
            purpose=purpose,
        )

    async def delete_file(self, principal: Principal, file_id: str) -> bool:
        now = self.clock.wall()
        return await self._call(files.delete_file, tenant_key(principal), file_id, now)

    # -- batches (the caller's own) -------------------------------------------------------

    async def create_batch(self, principal: Principal, body: BatchCreate, window_s: int) -> Batch:
        now = self.clock.wall()
        return await self._call(batches.create_batch, principal, body, window_s=window_s, now=now)

    async def batch(self, principal: Principal, batch_id: str) -> Batch | None:
        return await self._call(batches.get_batch, tenant_key(principal), batch_id)

    async def batches(
        self, principal: Principal, *, after: str | None = None, limit: int = 20
    ) -> BatchList:
        tenant = tenant_key(principal)
        return await self._call(batches.list_batches, tenant, after=after, limit=limit)

    async def cancel(self, principal: Principal, batch_id: str) -> Batch:
        return await self._call(
            batches.cancel_batch,
            tenant_key(principal),
            batch_id,
            now=self.clock.wall(),
            retention_s=self.retention_s,
            webhooks=self.webhooks,
        )

    # -- the runner's side (every tenant) -------------------------------------------------

    async def validating(self, limit: int) -> list[Pending]:
        return await self._call(batches.validating, limit)

    async def input_of(self, pending: Pending) -> bytes | None:
        """The batch's input file's bytes (None: deleted or expired since)."""
        now = self.clock.wall()
        found = await self._call(files.file_content, pending.tenant, pending.input_file_id, now)
        return None if found is None else found[1]

    async def start(
        self, pending: Pending, requests: Sequence[Request], provider: str | None = None
    ) -> bool:
        now = self.clock.wall()
        return await self._call(
            batches.start_batch, pending, requests, now, self.webhooks, provider
        )

    async def fail(self, batch_id: str, errors: Sequence[BatchError]) -> bool:
        return await self._call(
            batches.fail_batch,
            batch_id,
            errors,
            now=self.clock.wall(),
            retention_s=self.retention_s,
            webhooks=self.webhooks,
        )

    async def expire_due(self) -> int:
        now = self.clock.wall()
        return await self._call(
            batches.expire_due, now=now, retention_s=self.retention_s, webhooks=self.webhooks
        )

    async def claim(self, owner: str, n: int, lease_s: float) -> list[Claim]:
        return await self._call(work.claim, owner, n, now=self.clock.wall(), lease_s=lease_s)

    async def renew(self, owner: str, lease_s: float) -> int:
        return await self._call(work.renew, owner, until=self.clock.wall() + lease_s)

    async def finish(
        self,
        owner: str,
        item: Claim,
        *,
        ok: bool,
        result: bytes,
        usage: ItemUsage = NO_USAGE,
        model: str | None = None,
    ) -> tuple[bool, bool]:
        return await self._call(
            work.finish, owner, item, ok=ok, result=result, usage=usage, model=model
        )

    async def retry_later(self, owner: str, item: Claim, delay_s: float) -> bool:
        not_before = self.clock.wall() + delay_s
        return await self._call(work.retry_later, owner, item, not_before=not_before)

    async def release(self, owner: str) -> int:
        return await self._call(work.release, owner)

    # -- provider batches (``remote``) -----------------------------------------------------

    async def claim_remote(self, owner: str, lease_s: float) -> RemoteClaim | None:
        return await self._call(remote.claim, owner, now=self.clock.wall(), lease_s=lease_s)

    async def record_remote_id(self, owner: str, batch_id: str, remote_id: str) -> bool:
        return await self._call(remote.record_id, owner, batch_id, remote_id)

    async def remote_closing(self, batch_id: str) -> str | None:
        return await self._call(remote.closing, batch_id)

    async def finish_remote(
        self, owner: str, batch_id: str, outcomes: Sequence[Outcome], model: str | None
    ) -> bool:
        return await self._call(remote.finish, owner, batch_id, outcomes, model)

    async def back_off_remote(self, owner: str, batch_id: str, delay_s: float) -> int:
        not_before = self.clock.wall() + delay_s
        return await self._call(remote.back_off, owner, batch_id, not_before=not_before)

    async def unroute_remote(self, owner: str, batch_id: str) -> bool:
        return await self._call(remote.unroute, owner, batch_id)

    async def drop_stopped(self) -> int:
        return await self._call(finalize.drop_stopped, now=self.clock.wall())

    async def settled(self) -> list[str]:
        return await self._call(finalize.settled)

    async def finalize(self, batch_id: str) -> bool:
        now = self.clock.wall()
        return await self._call(
            finalize.finalize,
            batch_id,
            now=now,
            retention_s=self.retention_s,
            webhooks=self.webhooks,
        )

    async def sweep(self) -> tuple[int, int]:
        return await self._call(finalize.sweep, now=self.clock.wall())

    # -- the webhook outbox (every tenant) ------------------------------------------------

    async def claim_deliveries(self, owner: str, n: int, lease_s: float) -> list[Delivery]:
        return await self._call(outbox.claim, owner, n, now=self.clock.wall(), lease_s=lease_s)

    async def next_delivery_at(self) -> float | None:
        """Unix time the soonest pending event may be sent (None: nothing pending)."""
        return await self._call(outbox.next_due)

    async def delivered(self, owner: str, event_id: str, *, url: str, status: int) -> bool:
        now = self.clock.wall()
        return await self._call(outbox.delivered, owner, event_id, now=now, url=url, status=status)

    async def delivery_failed(
        self,
        owner: str,
        event_id: str,
        *,
        url: str | None,
        status: int | None,
        error: str,
        retry_in_s: float | None,
    ) -> bool:
        """One failed attempt: due again ``retry_in_s`` from now, or failed for good."""
        now = self.clock.wall()
        retry_at = None if retry_in_s is None else now + retry_in_s
        return await self._call(
            outbox.attempt_failed,
            owner,
            event_id,
            now=now,
            url=url,
            status=status,
            error=error,
            retry_at=retry_at,
        )

    async def release_deliveries(self, owner: str) -> int:
        return await self._call(outbox.release, owner)

    async def deliveries(
        self,
        *,
        batch_id: str | None = None,
        tenant: str | None = None,
        state: str | None = None,
        limit: int = 100,
    ) -> list[DeliveryRecord]:
        """The delivery log, newest first (``tenant``: the store's key, ``""`` for none)."""
        return await self._call(
            outbox.log, batch_id=batch_id, tenant=tenant, state=state, limit=limit
        )

    async def sweep_deliveries(self) -> int:
        """Delete delivered and failed events ``retention_s`` after their last attempt."""
        return await self._call(outbox.sweep, before=self.clock.wall() - self.retention_s)
