"""The ``batches`` table: create, read, list, cancel, and the validating -> in_progress |
failed step. Reads and the caller's writes name the tenant; the runner's steps are guarded
by the status they expect, so replicas that race for one step apply it once.

Status transitions (OpenAI's): validating -> in_progress -> finalizing -> completed;
validating -> failed (the input file is invalid or gone); in_progress -> cancelling ->
cancelled; validating -> cancelled (nothing ran); in_progress -> expired (the completion
window passed: ``closing`` is set at once, the status follows when the running items
settle). ``finalize.py`` writes the last three.

Every change to a status OpenAI has a webhook event for (and ``in_progress``) queues the
event in the same transaction (``outbox.enqueue``), for the webhooks given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from core.config_batch import WebhookConfig
from core.errors import InvalidRequestError
from core.tenancy import Principal
from policies.jobs import outbox
from policies.jobs.db import Db
from policies.jobs.errors import ConflictError, no_batch, no_file
from policies.jobs.files import UnknownCursor
from policies.jobs.jsonl import Request
from policies.jobs.objects import (
    FILE_PURPOSE,
    Batch,
    BatchCreate,
    BatchError,
    BatchErrors,
    BatchList,
    RequestCounts,
    new_id,
)
from policies.jobs.usage import batch_usage

_COLUMNS = (
    "id, endpoint, errors, input_file_id, completion_window, status, output_file_id,"
    " error_file_id, created_at, in_progress_at, expires_at, finalizing_at, completed_at,"
    " failed_at, expired_at, cancelling_at, cancelled_at, total, completed, failed, metadata,"
    " model, input_tokens, cached_tokens, output_tokens, reasoning_tokens"
)
_errors = msgspec.json.Decoder(BatchErrors)
_metadata = msgspec.json.Decoder(dict[str, str])
_encode = msgspec.json.Encoder().encode


class Pending(msgspec.Struct, frozen=True, kw_only=True):
    """A batch waiting for validation: whose it is and what to read."""

    id: str
    tenant: str
    principal: Principal
    endpoint: str
    input_file_id: str


def tenant_key(principal: Principal) -> str:
    """The store's tenant of a caller: its tenant, or ``""`` for the open gateway and the
    admin key (one namespace: neither is a tenant)."""
    return principal.tenant or ""


def _batch(row: Any) -> Batch:
    (batch_id, endpoint, errors, input_file_id, window, status, output_id, error_id) = row[:8]
    times = [None if value is None else int(value) for value in row[8:17]]
    total, completed, failed, metadata, model = row[17:22]
    return Batch(
        id=batch_id,
        endpoint=endpoint,
        errors=None if errors is None else _errors.decode(errors),
        input_file_id=input_file_id,
        completion_window=window,
        status=status,
        output_file_id=output_id,
        error_file_id=error_id,
        created_at=times[0] or 0,
        in_progress_at=times[1],
        expires_at=times[2],
        finalizing_at=times[3],
        completed_at=times[4],
        failed_at=times[5],
        expired_at=times[6],
        cancelling_at=times[7],
        cancelled_at=times[8],
        request_counts=RequestCounts(total=total, completed=completed, failed=failed),
        metadata=None if metadata is None else _metadata.decode(metadata),
        model=model,
        usage=batch_usage(*row[22:26]),
    )


def get_batch(db: Db, tenant: str, batch_id: str) -> Batch | None:
    row = db.execute(
        f"SELECT {_COLUMNS} FROM batches WHERE tenant = ? AND id = ?", (tenant, batch_id)
    ).fetchone()
    return None if row is None else _batch(row)


def create_batch(
    db: Db,
    principal: Principal,
    body: BatchCreate,
    *,
    window_s: int,
    now: float,
) -> Batch:
    """A new batch in ``validating``; 404 when the input file is not the tenant's (or
    expired), 400 when it was not uploaded for batches."""
    tenant, batch_id = tenant_key(principal), new_id("batch_")
    expires = body.output_expires_after
    with db.write():
        file = db.execute(
            "SELECT purpose FROM files WHERE tenant = ? AND id = ?"
            " AND (expires_at IS NULL OR expires_at > ?)",
            (tenant, body.input_file_id, now),
        ).fetchone()
        if file is None:
            raise no_file(body.input_file_id, "input_file_id")
        if file[0] != FILE_PURPOSE:
            raise _wrong_purpose(body.input_file_id, file[0])
        db.execute(
            "INSERT INTO batches (id, tenant, key_id, via, endpoint, input_file_id,"
            " completion_window, status, metadata, output_expires_s, created_at, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, 'validating', ?, ?, ?, ?)",
            (
                batch_id,
                tenant,
                principal.key_id,
                principal.via,
                body.endpoint,
                body.input_file_id,
                body.completion_window,
                None if body.metadata is None else _encode(body.metadata),
                None if expires is None else expires.seconds,
                int(now),
                int(now) + window_s,
            ),
        )
    batch = get_batch(db, tenant, batch_id)
    assert batch is not None
    return batch


def _wrong_purpose(file_id: str, purpose: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"File {file_id} has purpose '{purpose}'; a batch's input must have purpose 'batch'.",
        param="input_file_id",
        code="invalid_file_purpose",
    )


def list_batches(db: Db, tenant: str, *, after: str | None = None, limit: int = 20) -> BatchList:
    """One page of the tenant's batches, newest first."""
    where, params = ["tenant = ?"], [tenant]
    if after is not None:
        seq = db.execute(
            "SELECT seq FROM batches WHERE tenant = ? AND id = ?", (tenant, after)
        ).fetchone()
        if seq is None:
            raise UnknownCursor(after)
        where.append("seq < ?")
        params.append(seq[0])
    rows = db.execute(
        f"SELECT {_COLUMNS} FROM batches WHERE {' AND '.join(where)} ORDER BY seq DESC LIMIT ?",
        (*params, limit + 1),
    ).fetchall()
    data = [_batch(row) for row in rows[:limit]]
    return BatchList(
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=len(rows) > limit,
    )


def cancel_batch(
    db: Db,
    tenant: str,
    batch_id: str,
    *,
    now: float,
    retention_s: float,
    webhooks: Mapping[str, WebhookConfig] | None = None,
) -> Batch:
    """Stop a batch: one still validating is cancelled at once (``batch.cancelled`` is
    queued); one in progress turns ``cancelling`` (its pending items are dropped by the
    next finalize pass, its running ones finish). Cancelling again is a no-op; a batch
    that ended is a 409."""
    with db.write():
        # locked (Postgres): a runner starting the batch meanwhile finishes first, so a
        # batch that just went in_progress is cancelled as one, never left half-started
        row = db.execute(
            f"SELECT status FROM batches WHERE tenant = ? AND id = ?{db.lock()}",
            (tenant, batch_id),
        ).fetchone()
        if row is None:
            raise no_batch(batch_id)
        status = row[0]
        if status == "validating":
            db.execute(
                "UPDATE batches SET status = 'cancelled', cancelling_at = ?, cancelled_at = ?,"
                " delete_at = ? WHERE id = ?",
                (int(now), int(now), now + retention_s, batch_id),
            )
            outbox.enqueue(
                db,
                webhooks,
                tenant=tenant,
                batch_id=batch_id,
                event="batch.cancelled",
                at=now,
            )
        elif status == "in_progress":
            db.execute(
                "UPDATE batches SET status = 'cancelling', cancelling_at = ?,"
                " closing = 'cancelled' WHERE id = ?",
                (int(now), batch_id),
            )
        elif status not in ("cancelling", "cancelled"):
            raise ConflictError(f"Cannot cancel a batch with status '{status}'.", param="batch_id")
    batch = get_batch(db, tenant, batch_id)
    assert batch is not None
    return batch


def validating(db: Db, limit: int) -> list[Pending]:
    """The oldest batches waiting for validation (any tenant: the runner's view)."""
    rows = db.execute(
        "SELECT id, tenant, key_id, via, endpoint, input_file_id FROM batches"
        " WHERE status = 'validating' ORDER BY seq LIMIT ?",
        (limit,),
    ).fetchall()
    return [
        Pending(
            id=batch_id,
            tenant=tenant,
            principal=Principal(tenant=tenant or None, key_id=key_id, via=via),
            endpoint=endpoint,
            input_file_id=file_id,
        )
        for batch_id, tenant, key_id, via, endpoint, file_id in rows
    ]


def start_batch(
    db: Db,
    pending: Pending,
    requests: Sequence[Request],
    now: float,
    webhooks: Mapping[str, WebhookConfig] | None = None,
    provider: str | None = None,
) -> bool:
    """validating -> in_progress with one pending item per request (and
    ``batch.in_progress`` queued), in one transaction; False when the batch is no longer
    validating (cancelled, or another runner won). ``provider``: the batch runs through
    that provider's batch API (``remote``), not item by item."""
    with db.write():
        cursor = db.execute(
            "UPDATE batches SET status = 'in_progress', in_progress_at = ?, total = ?,"
            " provider = ? WHERE id = ? AND status = 'validating'",
            (int(now), len(requests), provider, pending.id),
        )
        if cursor.rowcount != 1:
            return False
        db.executemany(
            "INSERT INTO items (batch_id, line, tenant, custom_id, body, state)"
            " VALUES (?, ?, ?, ?, ?, 'pending')",
            [(pending.id, r.line, pending.tenant, r.custom_id, r.body) for r in requests],
        )
        outbox.enqueue(
            db,
            webhooks,
            tenant=pending.tenant,
            batch_id=pending.id,
            event="batch.in_progress",
            at=now,
        )
    return True


def fail_batch(
    db: Db,
    batch_id: str,
    errors: Sequence[BatchError],
    *,
    now: float,
    retention_s: float,
    webhooks: Mapping[str, WebhookConfig] | None = None,
) -> bool:
    """validating -> failed with ``errors`` (and ``batch.failed`` queued); False when it
    was no longer validating."""
    payload = _encode(BatchErrors(data=list(errors)))
    with db.write():
        rows = db.execute(  # fetchall: a RETURNING statement must run to its end
            "UPDATE batches SET status = 'failed', failed_at = ?, errors = ?, delete_at = ?"
            " WHERE id = ? AND status = 'validating' RETURNING tenant",
            (int(now), payload, now + retention_s, batch_id),
        ).fetchall()
        for (tenant,) in rows:
            outbox.enqueue(
                db, webhooks, tenant=tenant, batch_id=batch_id, event="batch.failed", at=now
            )
    return bool(rows)


def expire_due(
    db: Db,
    *,
    now: float,
    retention_s: float,
    webhooks: Mapping[str, WebhookConfig] | None = None,
) -> int:
    """Batches past their completion window: one still validating expires at once
    (``batch.expired`` queued); one in progress stops taking work (``closing``) and expires
    when its running items settle. Returns how many were touched."""
    with db.write():
        expired = db.execute(
            "UPDATE batches SET status = 'expired', expired_at = ?, delete_at = ?"
            " WHERE status = 'validating' AND expires_at <= ? RETURNING id, tenant",
            (int(now), now + retention_s, now),
        ).fetchall()
        for batch_id, tenant in expired:
            outbox.enqueue(
                db,
                webhooks,
                tenant=tenant,
                batch_id=batch_id,
                event="batch.expired",
                at=now,
            )
        closing = db.execute(
            "UPDATE batches SET closing = 'expired'"
            " WHERE status = 'in_progress' AND closing IS NULL AND expires_at <= ?"
            " AND completed + failed < total",
            (now,),
        ).rowcount
    return int(len(expired) + closing)
