"""The runner's bookkeeping between claims, in this order: validate new batches (validating
-> in_progress | failed; a batch a provider's batch API takes is marked with that provider,
``provider_route``), stop batches past their completion window, drop what stopping
batches will not run, finalize every batch whose items all settled, and, when due, delete
expired files, batches and ended webhook deliveries. Every step is a guarded transaction
in the store, so replicas may run it at the same time: each change happens once, and so
does the webhook event the store queues with it (``policies.jobs.outbox``)."""

from __future__ import annotations

import asyncio

import structlog

from gateway.jobs.provider_route import provider_for
from gateway.jobs.validate import body_check
from gateway.process.runtime import Runtime
from policies.jobs import JobStore
from policies.jobs.batches import Pending
from policies.jobs.jsonl import parse_jsonl
from policies.jobs.objects import BatchError

_log = structlog.get_logger("switchyard")
VALIDATE_AT_ONCE = 8  # batches validated per pass (each may be 50,000 lines)


async def validate(store: JobStore, runtime: Runtime) -> int:
    """Validate the oldest batches waiting; how many changed status."""
    changed = 0
    for pending in await store.validating(VALIDATE_AT_ONCE):
        changed += await _validate_one(store, runtime, pending)
    return changed


async def _validate_one(store: JobStore, runtime: Runtime, pending: Pending) -> int:
    content = await store.input_of(pending)
    if content is None:
        gone = BatchError(
            code="file_not_found",
            message=f"The input file {pending.input_file_id} was deleted or expired.",
            param="input_file_id",
        )
        return int(await store.fail(pending.id, [gone]))
    check = body_check(runtime, pending.principal)
    limit = runtime.config.batch.max_requests
    # Off the event loop: a large file takes a moment to read line by line.
    requests, errors = await asyncio.to_thread(
        parse_jsonl, content, endpoint=pending.endpoint, check=check, max_requests=limit
    )
    if errors:
        failed = await store.fail(pending.id, errors)
        _log.info("batch.failed", batch_id=pending.id, errors=len(errors))
        return int(failed)
    provider = provider_for(runtime, pending.principal, pending.endpoint, requests)
    started = await store.start(pending, requests, provider)
    if started:
        _log.info("batch.started", batch_id=pending.id, requests=len(requests), provider=provider)
    return int(started)


async def settle(store: JobStore) -> int:
    """Expire, drop and finalize; how many batches were finalized."""
    await store.expire_due()
    await store.drop_stopped()
    finalized = 0
    for batch_id in await store.settled():
        if await store.finalize(batch_id):
            finalized += 1
            _log.info("batch.finalized", batch_id=batch_id)
    return finalized


async def sweep(store: JobStore) -> None:
    files, batches = await store.sweep()
    deliveries = await store.sweep_deliveries()
    if files or batches or deliveries:
        _log.info("batch.swept", files=files, batches=batches, webhook_deliveries=deliveries)
