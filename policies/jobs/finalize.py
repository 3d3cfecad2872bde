"""The end of a batch: drop what a stopping batch will not run, write the output and error
files, set the final status; and the retention sweep.

``finalize`` is one transaction: it checks that every item is done or failed, writes the
output file (the ``done`` items' lines, in input order) and the error file (the
``failed`` ones'), sets the final status with ``finalizing_at`` and the end time, and
deletes the items, and queues the batch's webhook event (``outbox``). So a crash never
leaves a half-written batch or a lost event, a second replica that races for the same
batch (on Postgres it waits for the batch's row lock) finds it already final and does
nothing, and a result is never in two places. (``finalizing`` is therefore never seen
from outside on this store: the files are written inside the transaction that would have
left it.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from core.config_batch import WebhookConfig
from policies.jobs import outbox
from policies.jobs.db import Db
from policies.jobs.files import insert_file
from policies.jobs.objects import OUTPUT_PURPOSE, dropped_line

# closing -> (final status, the column that records when it ended)
_FINAL: dict[str | None, tuple[str, str]] = {
    None: ("completed", "completed_at"),
    "cancelled": ("cancelled", "cancelled_at"),
    "expired": ("expired", "expired_at"),
}


def drop_stopped(db: Db, *, now: float) -> int:
    """In batches that are cancelling or expiring, fail every item that is pending or
    whose lease ran out (its runner is gone) with ``batch_cancelled`` / ``batch_expired``;
    items running under a live lease finish. A batch submitted to a provider's batch API
    is left to its loop (``remote``), which cancels it there and records what it did.
    One transaction per batch; returns how many items were dropped."""
    stopping = db.execute(
        "SELECT id, closing FROM batches"
        " WHERE status IN ('in_progress', 'cancelling') AND closing IS NOT NULL"
        " AND provider_batch_id IS NULL ORDER BY seq"
    ).fetchall()
    dropped = 0
    for batch_id, closing in stopping:
        why: Literal["cancelled", "expired"] = "cancelled" if closing == "cancelled" else "expired"
        dropped += _drop(db, batch_id, why, now)
    return dropped


def _drop(db: Db, batch_id: str, why: Literal["cancelled", "expired"], now: float) -> int:
    with db.write():
        # Locked in line order (Postgres): a replica dropping the same batch waits, then
        # finds these rows failed and leaves them, so each is counted once; a row a runner
        # is finishing right now is waited for and left alone if it finished.
        rows = db.execute(
            "SELECT line, custom_id FROM items WHERE batch_id = ?"
            " AND state IN ('pending', 'running')"
            f" AND (state = 'pending' OR lease_until < ?) ORDER BY line{db.lock()}",
            (batch_id, now),
        ).fetchall()
        if not rows:
            return 0
        db.executemany(
            "UPDATE items SET state = 'failed', result = ?, owner = NULL,"
            " lease_until = NULL WHERE batch_id = ? AND line = ?",
            [(dropped_line(custom_id, why), batch_id, line) for line, custom_id in rows],
        )
        db.execute("UPDATE batches SET failed = failed + ? WHERE id = ?", (len(rows), batch_id))
    return len(rows)


def settled(db: Db) -> list[str]:
    """Batches whose every item is done or failed: ready for ``finalize``."""
    rows = db.execute(
        "SELECT id FROM batches WHERE status IN ('in_progress', 'cancelling')"
        " AND completed + failed >= total ORDER BY seq"
    ).fetchall()
    return [row[0] for row in rows]


def finalize(
    db: Db,
    batch_id: str,
    *,
    now: float,
    retention_s: float,
    webhooks: Mapping[str, WebhookConfig] | None = None,
) -> bool:
    """Write the batch's files and final status and queue ``batch.<status>``; False when
    it is not ready (or another replica finalized it first)."""
    with db.write():
        row = db.execute(
            "SELECT tenant, closing, output_expires_s FROM batches WHERE id = ?"
            " AND status IN ('in_progress', 'cancelling') AND completed + failed >= total"
            + db.lock(),  # a replica finalizing it too waits, then finds it final
            (batch_id,),
        ).fetchone()
        if row is None:
            return False
        tenant, closing, output_expires_s = row
        keep_s = min(retention_s, output_expires_s or retention_s)
        expires_at = int(now + keep_s)
        files = {}
        for state, suffix in (("done", "output"), ("failed", "error")):
            lines = db.execute(
                "SELECT result FROM items WHERE batch_id = ? AND state = ? ORDER BY line",
                (batch_id, state),
            ).fetchall()
            if lines:
                content = b"".join(bytes(line[0]) + b"\n" for line in lines)
                files[suffix] = insert_file(
                    db,
                    tenant=tenant,
                    filename=f"{batch_id}_{suffix}.jsonl",
                    purpose=OUTPUT_PURPOSE,
                    content=content,
                    created_at=int(now),
                    expires_at=expires_at,
                ).id
        status, ended_column = _FINAL[closing]
        db.execute(
            f"UPDATE batches SET status = ?, finalizing_at = ?, {ended_column} = ?,"
            " output_file_id = ?, error_file_id = ?, delete_at = ?, closing = NULL"
            " WHERE id = ?",
            (
                status,
                int(now),
                int(now),
                files.get("output"),
                files.get("error"),
                now + retention_s,
                batch_id,
            ),
        )
        db.execute("DELETE FROM items WHERE batch_id = ?", (batch_id,))
        outbox.enqueue(
            db, webhooks, tenant=tenant, batch_id=batch_id, event=f"batch.{status}", at=now
        )
    return True


def sweep(db: Db, *, now: float) -> tuple[int, int]:
    """Delete files past ``expires_at`` and batches past ``delete_at`` (with any items
    left); returns (files, batches) deleted."""
    with db.write():
        files = db.execute(
            "DELETE FROM files WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,)
        ).rowcount
        ended = [
            row[0]
            for row in db.execute(
                "SELECT id FROM batches WHERE delete_at IS NOT NULL AND delete_at <= ?", (now,)
            )
        ]
        db.executemany("DELETE FROM items WHERE batch_id = ?", [(b,) for b in ended])
        db.executemany("DELETE FROM batches WHERE id = ?", [(b,) for b in ended])
    return int(files), len(ended)
