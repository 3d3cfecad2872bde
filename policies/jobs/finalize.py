"""The end of a batch: drop what a stopping batch will not run, write the output and error
files, set the final status; and the retention sweep.

``finalize`` is one transaction: it checks that every item is done or failed, writes the
output file (the ``done`` items' lines, in input order) and the error file (the
``failed`` ones'), sets the final status with ``finalizing_at`` and the end time, and
deletes the items, and queues the batch's webhook event (``outbox``). So a crash never
leaves a half-written batch or a lost event, a second replica that
races for the same batch finds it already final and does nothing, and a result is never
in two places. (``finalizing`` is therefore never seen from outside on this store: the
files are written inside the transaction that would have left it.)
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Literal

from core.config_batch import WebhookConfig
from policies.jobs import outbox
from policies.jobs.files import insert_file
from policies.jobs.objects import OUTPUT_PURPOSE, dropped_line
from policies.jobs.schema import write

# closing -> (final status, the column that records when it ended)
_FINAL: dict[str | None, tuple[str, str]] = {
    None: ("completed", "completed_at"),
    "cancelled": ("cancelled", "cancelled_at"),
    "expired": ("expired", "expired_at"),
}


def drop_stopped(conn: sqlite3.Connection, *, now: float) -> int:
    """In batches that are cancelling or expiring, fail every item that is pending or
    whose lease ran out (its runner is gone) with ``batch_cancelled`` / ``batch_expired``;
    items running under a live lease finish. Returns how many were dropped."""
    dropped = 0
    with write(conn):
        stopping = conn.execute(
            "SELECT id, closing FROM batches"
            " WHERE status IN ('in_progress', 'cancelling') AND closing IS NOT NULL"
        ).fetchall()
        for batch_id, closing in stopping:
            why: Literal["cancelled", "expired"] = (
                "cancelled" if closing == "cancelled" else "expired"
            )
            rows = conn.execute(
                "SELECT line, custom_id FROM items WHERE batch_id = ?"
                " AND state IN ('pending', 'running')"
                " AND (state = 'pending' OR lease_until < ?)",
                (batch_id, now),
            ).fetchall()
            conn.executemany(
                "UPDATE items SET state = 'failed', result = ?, owner = NULL,"
                " lease_until = NULL WHERE batch_id = ? AND line = ?",
                [(dropped_line(custom_id, why), batch_id, line) for line, custom_id in rows],
            )
            conn.execute(
                "UPDATE batches SET failed = failed + ? WHERE id = ?", (len(rows), batch_id)
            )
            dropped += len(rows)
    return dropped


def settled(conn: sqlite3.Connection) -> list[str]:
    """Batches whose every item is done or failed: ready for ``finalize``."""
    rows = conn.execute(
        "SELECT id FROM batches WHERE status IN ('in_progress', 'cancelling')"
        " AND completed + failed >= total ORDER BY seq"
    ).fetchall()
    return [row[0] for row in rows]


def finalize(
    conn: sqlite3.Connection,
    batch_id: str,
    *,
    now: float,
    retention_s: float,
    webhooks: Mapping[str, WebhookConfig] | None = None,
) -> bool:
    """Write the batch's files and final status and queue ``batch.<status>``; False when
    it is not ready (or another replica finalized it first)."""
    with write(conn):
        row = conn.execute(
            "SELECT tenant, closing, output_expires_s FROM batches WHERE id = ?"
            " AND status IN ('in_progress', 'cancelling') AND completed + failed >= total",
            (batch_id,),
        ).fetchone()
        if row is None:
            return False
        tenant, closing, output_expires_s = row
        keep_s = min(retention_s, output_expires_s or retention_s)
        expires_at = int(now + keep_s)
        files = {}
        for state, suffix in (("done", "output"), ("failed", "error")):
            lines = conn.execute(
                "SELECT result FROM items WHERE batch_id = ? AND state = ? ORDER BY line",
                (batch_id, state),
            ).fetchall()
            if lines:
                content = b"".join(bytes(line[0]) + b"\n" for line in lines)
                files[suffix] = insert_file(
                    conn,
                    tenant=tenant,
                    filename=f"{batch_id}_{suffix}.jsonl",
                    purpose=OUTPUT_PURPOSE,
                    content=content,
                    created_at=int(now),
                    expires_at=expires_at,
                ).id
        status, ended_column = _FINAL[closing]
        conn.execute(
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
        conn.execute("DELETE FROM items WHERE batch_id = ?", (batch_id,))
        outbox.enqueue(
            conn, webhooks, tenant=tenant, batch_id=batch_id, event=f"batch.{status}", at=now
        )
    return True


def sweep(conn: sqlite3.Connection, *, now: float) -> tuple[int, int]:
    """Delete files past ``expires_at`` and batches past ``delete_at`` (with any items
    left); returns (files, batches) deleted."""
    with write(conn):
        files = conn.execute(
            "DELETE FROM files WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,)
        ).rowcount
        ended = [
            row[0]
            for row in conn.execute(
                "SELECT id FROM batches WHERE delete_at IS NOT NULL AND delete_at <= ?", (now,)
            )
        ]
        conn.executemany("DELETE FROM items WHERE batch_id = ?", [(b,) for b in ended])
        conn.executemany("DELETE FROM batches WHERE id = ?", [(b,) for b in ended])
    return int(files), len(ended)
