"""The ``files`` table: add, read, list (cursor pages), delete. Every query names the
tenant, so one tenant's ids mean nothing to another; a file past ``expires_at`` is gone
for readers at once, before the sweep deletes it."""

from __future__ import annotations

from typing import Any, Literal

from policies.jobs.db import Db
from policies.jobs.objects import FileList, FileObject, new_id

_COLUMNS = "id, bytes, created_at, filename, purpose, expires_at"
_LIVE = "(expires_at IS NULL OR expires_at > ?)"


class UnknownCursor(ValueError):
    """``after`` names no object this tenant can see."""


def _file(row: Any) -> FileObject:
    file_id, size, created_at, filename, purpose, expires_at = row
    return FileObject(
        id=str(file_id),
        bytes=int(size),
        created_at=int(created_at),
        filename=str(filename),
        purpose=str(purpose),
        expires_at=None if expires_at is None else int(expires_at),
    )


def insert_file(
    db: Db,
    *,
    tenant: str,
    filename: str,
    purpose: str,
    content: bytes,
    created_at: int,
    expires_at: int | None,
) -> FileObject:
    """Insert a file (inside the caller's transaction) and return its object. A NUL in
    ``filename`` becomes U+FFFD (no database text holds NUL), on every backend alike."""
    file_id = new_id("file-")
    filename = filename.replace("\x00", "\ufffd")
    db.execute(
        "INSERT INTO files (id, tenant, filename, purpose, bytes, created_at, expires_at,"
        " content) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (file_id, tenant, filename, purpose, len(content), created_at, expires_at, content),
    )
    return FileObject(
        id=file_id,
        bytes=len(content),
        created_at=created_at,
        filename=filename,
        purpose=purpose,
        expires_at=expires_at,
    )


def add_file(
    db: Db,
    *,
    tenant: str,
    filename: str,
    purpose: str,
    content: bytes,
    now: float,
    expires_at: int | None,
) -> FileObject:
    with db.write():
        return insert_file(
            db,
            tenant=tenant,
            filename=filename,
            purpose=purpose,
            content=content,
            created_at=int(now),
            expires_at=expires_at,
        )


def get_file(db: Db, tenant: str, file_id: str, now: float) -> FileObject | None:
    row = db.execute(
        f"SELECT {_COLUMNS} FROM files WHERE tenant = ? AND id = ? AND {_LIVE}",
        (tenant, file_id, now),
    ).fetchone()
    return None if row is None else _file(row)


def file_content(db: Db, tenant: str, file_id: str, now: float) -> tuple[FileObject, bytes] | None:
    row = db.execute(
        f"SELECT {_COLUMNS}, content FROM files WHERE tenant = ? AND id = ? AND {_LIVE}",
        (tenant, file_id, now),
    ).fetchone()
    return None if row is None else (_file(row[:-1]), bytes(row[-1]))


def list_files(
    db: Db,
    tenant: str,
    now: float,
    *,
    after: str | None = None,
    limit: int = 10_000,
    order: Literal["asc", "desc"] = "desc",
    purpose: str | None = None,
) -> FileList:
    """One page of the tenant's files, newest first unless ``order`` is ``asc``."""
    where, params = [f"tenant = ? AND {_LIVE}"], [tenant, now]
    if purpose is not None:
        where.append("purpose = ?")
        params.append(purpose)
    if after is not None:
        seq = db.execute(
            "SELECT seq FROM files WHERE tenant = ? AND id = ?", (tenant, after)
        ).fetchone()
        if seq is None:
            raise UnknownCursor(after)
        where.append("seq > ?" if order == "asc" else "seq < ?")
        params.append(seq[0])
    direction = "ASC" if order == "asc" else "DESC"
    rows = db.execute(
        f"SELECT {_COLUMNS} FROM files WHERE {' AND '.join(where)}"
        f" ORDER BY seq {direction} LIMIT ?",
        (*params, limit + 1),
    ).fetchall()
    data = [_file(row) for row in rows[:limit]]
    return FileList(
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=len(rows) > limit,
    )


def delete_file(db: Db, tenant: str, file_id: str, now: float) -> bool:
    with db.write():
        cursor = db.execute(
            f"DELETE FROM files WHERE tenant = ? AND id = ? AND {_LIVE}", (tenant, file_id, now)
        )
        return cursor.rowcount == 1
