"""``JobStore``: the async face of the job store's SQLite file.

Every operation runs in one worker thread that owns the connection (SQLite serialises
writers anyway; one thread keeps the event loop off disk waits and off fsync), in its
own transaction. Times come from the injected clock's ``wall()``: leases are compared
across processes, so they must be Unix time, not one process's monotonic clock.

Caller-facing methods take the ``Principal`` and scope every query to its tenant
(``batches.tenant_key``); the runner's methods work across tenants. ``retention_s`` and
``webhooks`` (``batch.webhooks``: which events to queue in the outbox, and for whom) are
read at each call, so the runner can keep them current with the config.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

from core.clock import Clock
from core.config_batch import WebhookConfig
from core.tenancy import Principal
from policies.jobs import batches, files, finalize, outbox, work
from policies.jobs.batches import Pending, tenant_key
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
from policies.jobs.schema import connect
from policies.jobs.usage import NO_USAGE, ItemUsage
from policies.jobs.work import Claim

T = TypeVar("T")


class JobStore:
    """Files, batches and items in the SQLite file at ``path`` (created if needed)."""

    def __init__(self, path: Path, clock: Clock, *, retention_s: float) -> None:
        self.path = path
        self.clock = clock
        self.retention_s = retention_s
        self.webhooks: Mapping[str, WebhookConfig] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="job-store")
        self._conn: sqlite3.Connection | None = None

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, partial(self._run, fn, args, kwargs))

    def _run(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        if self._conn is None:
            self._conn = connect(self.path)
        return fn(self._conn, *args, **kwargs)

    async def open(self) -> None:
        """Create the file and its schema now (so a bad path fails at start)."""
        await self._call(lambda conn: None)

    async def aclose(self) -> None:
        def close(conn: sqlite3.Connection) -> None:
            conn.close()
            self._conn = None

        if self._conn is not None:
            await self._call(close)
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

    async def start(self, pending: Pending, requests: Sequence[Request]) -> bool:
        now = self.clock.wall()
        return await self._call(batches.start_batch, pending, requests, now, self.webhooks)

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
