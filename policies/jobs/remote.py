"""Batches that run through a provider's own batch API (``batches.provider`` set when the
batch started; docs/batches.md, "Through the provider's batch API"): the whole batch is
claimed at once, so one gateway submits it and polls it, and replicas never submit twice.

- ``claim``: the oldest such batch with claimable items (pending and past their
  back-off, or running under a lease that ran out: its gateway died), submitted or not
  stopping (one stopped before it was sent is dropped by ``finalize.drop_stopped`` like
  any other), gives *every* open item to ``owner`` under one lease, in one transaction
  (Postgres: the batch row locked ``FOR UPDATE SKIP LOCKED``, so replicas claiming at
  once take different batches). The runner's heartbeat renews these leases with its
  others (``work.renew``), and ``work.release`` hands them back at shutdown.
- ``record_id``: the provider's batch id, written only while ``owner`` still holds the
  items and only once; a batch with an id is polled on resume, never submitted again.
- ``finish``: every item's line, state and the batch's counters and usage in one
  transaction, guarded by the owner (a gateway that lost the lease writes nothing).
- ``back_off``: the items pending again, not claimable before ``not_before`` (a submit
  the provider refused for now); ``unroute``: the batch, not yet submitted, goes back to
  the item-by-item path (its alias no longer resolves to a batch-API provider).
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import Struct
from msgspec.structs import astuple

from core.tenancy import Principal
from policies.jobs.db import Db
from policies.jobs.usage import ItemUsage
from policies.jobs.work import _CLAIMABLE


class RemoteItem(Struct, frozen=True):
    line: int
    custom_id: str
    body: bytes


class RemoteClaim(Struct, frozen=True, kw_only=True):
    """A provider batch one gateway holds: where it goes, its upstream id if submitted,
    whether it must stop (``closing``: cancelled or expired), and its open items."""

    batch_id: str
    provider: str
    provider_batch_id: str | None
    closing: str | None
    principal: Principal
    attempts: int  # submits refused so far
    items: list[RemoteItem]


class Outcome(Struct, frozen=True):
    """What to record for one item: its output (``ok``) or error line, and its tokens."""

    line: int
    ok: bool
    result: bytes
    usage: ItemUsage


_PICK = f"""SELECT b.id, b.provider, b.provider_batch_id, b.closing, b.tenant, b.key_id, b.via
FROM batches b
WHERE b.provider IS NOT NULL AND b.status IN ('in_progress', 'cancelling')
  AND (b.closing IS NULL OR b.provider_batch_id IS NOT NULL)
  AND EXISTS (SELECT 1 FROM items i WHERE i.batch_id = b.id AND {_CLAIMABLE})
ORDER BY b.seq LIMIT 1"""


def claim(db: Db, owner: str, *, now: float, lease_s: float) -> RemoteClaim | None:
    """One provider batch, all its open items leased to ``owner`` until ``now + lease_s``."""
    with db.write():
        row = db.execute(_PICK + db.lock("b", skip_locked=True), {"now": now}).fetchone()
        if row is None:
            return None
        batch_id, provider, remote_id, closing, tenant, key_id, via = row
        rows = db.execute(
            "UPDATE items SET state = 'running', owner = ?, lease_until = ?"
            " WHERE batch_id = ? AND state IN ('pending', 'running')"
            " RETURNING line, custom_id, body, attempts",
            (owner, now + lease_s, batch_id),
        ).fetchall()
    items = sorted((RemoteItem(line, cid, bytes(body)) for line, cid, body, _ in rows), key=_line)
    return RemoteClaim(
        batch_id=batch_id,
        provider=provider,
        provider_batch_id=remote_id,
        closing=closing,
        principal=Principal(tenant=tenant or None, key_id=key_id, via=via),
        attempts=max((attempts for *_, attempts in rows), default=0),
        items=items,
    )


def _line(item: RemoteItem) -> int:
    return item.line


def _holds(db: Db, owner: str, batch_id: str) -> bool:
    row = db.execute(
        "SELECT COUNT(*) FROM items WHERE batch_id = ? AND owner = ? AND state = 'running'",
        (batch_id, owner),
    ).fetchone()
    return bool(row and row[0])


def record_id(db: Db, owner: str, batch_id: str, provider_batch_id: str) -> bool:
    """Store the provider's batch id; False when ``owner`` lost the batch or it has one."""
    with db.write():
        db.execute(f"SELECT id FROM batches WHERE id = ?{db.lock()}", (batch_id,)).fetchall()
        if not _holds(db, owner, batch_id):
            return False
        return bool(
            db.execute(
                "UPDATE batches SET provider_batch_id = ?"
                " WHERE id = ? AND provider_batch_id IS NULL",
                (provider_batch_id, batch_id),
            ).rowcount
        )


def closing(db: Db, batch_id: str) -> str | None:
    """``cancelled`` or ``expired`` once the batch must stop, else None."""
    row = db.execute("SELECT closing FROM batches WHERE id = ?", (batch_id,)).fetchone()
    return None if row is None else row[0]


def finish(
    db: Db, owner: str, batch_id: str, outcomes: Sequence[Outcome], model: str | None
) -> bool:
    """Record every outcome (done or failed), the counters, usage and ``model``; False,
    writing nothing, unless ``owner`` holds exactly these items."""
    with db.write():
        db.execute(f"SELECT id FROM batches WHERE id = ?{db.lock()}", (batch_id,)).fetchall()
        held = db.execute(
            "SELECT line FROM items WHERE batch_id = ? AND owner = ? AND state = 'running'",
            (batch_id, owner),
        ).fetchall()
        if sorted(row[0] for row in held) != sorted(o.line for o in outcomes):
            return False
        db.executemany(
            "UPDATE items SET state = ?, result = ?, owner = NULL, lease_until = NULL"
            " WHERE batch_id = ? AND line = ?",
            [("done" if o.ok else "failed", o.result, batch_id, o.line) for o in outcomes],
        )
        totals = [sum(column) for column in zip(*(astuple(o.usage) for o in outcomes), strict=True)]
        done = sum(1 for o in outcomes if o.ok)
        db.execute(
            "UPDATE batches SET completed = completed + ?, failed = failed + ?,"
            " model = COALESCE(model, ?), input_tokens = input_tokens + ?,"
            " cached_tokens = cached_tokens + ?, output_tokens = output_tokens + ?,"
            " reasoning_tokens = reasoning_tokens + ? WHERE id = ?",
            (done, len(outcomes) - done, model, *(totals or [0, 0, 0, 0]), batch_id),
        )
    return True


def back_off(db: Db, owner: str, batch_id: str, *, not_before: float) -> int:
    """The batch's items pending again, claimable from ``not_before``; one more attempt."""
    with db.write():
        return int(
            db.execute(
                "UPDATE items SET state = 'pending', owner = NULL, lease_until = ?,"
                " attempts = attempts + 1"
                " WHERE batch_id = ? AND owner = ? AND state = 'running'",
                (not_before, batch_id, owner),
            ).rowcount
        )


def unroute(db: Db, owner: str, batch_id: str) -> bool:
    """A batch not yet submitted goes back to the item-by-item path (its items pending,
    claimable at once); False when it was submitted meanwhile or ``owner`` lost it."""
    with db.write():
        db.execute(f"SELECT id FROM batches WHERE id = ?{db.lock()}", (batch_id,)).fetchall()
        if not _holds(db, owner, batch_id):
            return False
        moved = db.execute(
            "UPDATE batches SET provider = NULL WHERE id = ? AND provider_batch_id IS NULL",
            (batch_id,),
        ).rowcount
        if moved:
            db.execute(
                "UPDATE items SET state = 'pending', owner = NULL, lease_until = NULL"
                " WHERE batch_id = ? AND owner = ? AND state = 'running'",
                (batch_id, owner),
            )
    return bool(moved)
