"""The webhook outbox: batch events waiting to be delivered, and their delivery log.

An event is a row of ``webhook_deliveries``, inserted by ``enqueue`` *inside* the
transaction that changes the batch's status (``batches``, ``finalize``), so the status
change and its event commit together: a crash never loses an event nor writes one twice.
Only events some configured webhook wants become rows (``endpoint_for``).

Senders (gateway/jobs/webhooks.py, one per gateway process) share the rows as runners
share items (``work``): ``claim`` leases due rows to one owner in one ``UPDATE …
RETURNING`` (on Postgres with ``FOR UPDATE SKIP LOCKED``), so two processes never send the
same attempt; an attempt's outcome is written only by the owner that holds the row
(``delivered``, ``attempt_failed``); a sender that dies leaves its lease, and the row is
due again when it runs out. A row ends
``delivered`` (a 2xx) or ``failed`` (its attempts ran out); the ended rows are the log
(``log``) until the retention sweep (``sweep``).

Delivery is at least once: a sender that dies after the receiver answered but before
``delivered`` committed sends the event again, under the same ``webhook-id``; receivers
deduplicate on it.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import msgspec

from core.config_batch import ANY_TENANT, WebhookConfig
from policies.jobs.db import Db
from policies.jobs.objects import new_id

JITTER = 0.25  # up to this share added to a back-off: replicas' retries spread out
MAX_ERROR_CHARS = 500
_encode = msgspec.json.Encoder().encode


class Event(msgspec.Struct, kw_only=True):
    """OpenAI's webhook event object (``batch.completed`` and the rest): a thin payload
    naming the batch; the receiver reads the batch itself for the rest."""

    id: str
    type: str
    created_at: int
    data: dict[str, str]
    object: str = "event"


class Delivery(msgspec.Struct, frozen=True, kw_only=True):
    """A claimed row: the event to send and the attempts made before this one."""

    id: str
    endpoint: str
    batch_id: str
    type: str
    payload: bytes
    attempts: int


class DeliveryRecord(msgspec.Struct, kw_only=True):
    """One row of the delivery log (``GET /admin/webhook_deliveries``)."""

    id: str
    type: str
    batch_id: str
    tenant: str | None  # None: the open gateway's or the admin key's batches
    endpoint: str  # the ``batch.webhooks`` entry: the tenant's name or ``*``
    state: str  # pending, delivered, failed
    attempts: int
    url: str | None  # where the last attempt went
    last_status: int | None  # its HTTP status (None: no answer)
    last_error: str | None
    created_at: float
    updated_at: float
    next_attempt_at: float | None  # pending rows only
    delivered_at: float | None
    payload: msgspec.Raw  # the event exactly as it is signed and sent


def endpoint_for(webhooks: Mapping[str, WebhookConfig], tenant: str, event: str) -> str | None:
    """The ``batch.webhooks`` entry that gets ``tenant``'s ``event``: the tenant's own
    entry, else ``*``; None when that entry does not want the event (or there is none).
    ``tenant`` is the store's key: ``""`` (the open gateway, the admin key) has only ``*``."""
    name = tenant if tenant and tenant in webhooks else ANY_TENANT
    config = webhooks.get(name)
    if config is None or event not in config.events:
        return None
    return name


def enqueue(
    db: Db,
    webhooks: Mapping[str, WebhookConfig] | None,
    *,
    tenant: str,
    batch_id: str,
    event: str,
    at: float,
) -> str | None:
    """Queue ``event`` for ``batch_id``, due at once; its id (also its ``webhook-id``), or
    None when no webhook wants it. Runs inside the caller's transaction: it must be the
    one that changed the status."""
    endpoint = endpoint_for(webhooks, tenant, event) if webhooks else None
    if endpoint is None:
        return None
    event_id = new_id("evt_")
    payload = Event(id=event_id, type=event, created_at=int(at), data={"id": batch_id})
    db.execute(
        "INSERT INTO webhook_deliveries (id, tenant, endpoint, batch_id, type, payload,"
        " state, next_attempt_at, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
        (event_id, tenant, endpoint, batch_id, event, _encode(payload), at, at, at),
    )
    return event_id


# ``{lock}``: FOR UPDATE SKIP LOCKED on Postgres (a row another sender is claiming is
# skipped, one it claimed meanwhile is re-checked and left), nothing on SQLite.
_CLAIM = """
UPDATE webhook_deliveries SET owner = :owner, lease_until = :until
WHERE seq IN (
    SELECT seq FROM webhook_deliveries
    WHERE state = 'pending' AND next_attempt_at <= :now
      AND (lease_until IS NULL OR lease_until < :now)
    ORDER BY next_attempt_at, seq
    LIMIT :n{lock})
RETURNING id, endpoint, batch_id, type, payload, attempts
"""


def claim(db: Db, owner: str, n: int, *, now: float, lease_s: float) -> list[Delivery]:
    """Up to ``n`` due rows for ``owner``, leased until ``now + lease_s`` (longer than an
    attempt may take, so no one else sends them meanwhile)."""
    with db.write():
        claim_sql = _CLAIM.format(lock=db.lock(skip_locked=True))
        params = {"owner": owner, "until": now + lease_s, "now": now, "n": n}
        rows = db.execute(claim_sql, params).fetchall()
    return [
        Delivery(
            id=event_id,
            endpoint=endpoint,
            batch_id=batch_id,
            type=event,
            payload=bytes(payload),
            attempts=attempts,
        )
        for event_id, endpoint, batch_id, event, payload, attempts in rows
    ]


def next_due(db: Db) -> float | None:
    """When the soonest pending row may be claimed (its time, or its lease's end); None
    when nothing is pending."""
    row = db.execute(
        "SELECT MIN(CASE WHEN lease_until > next_attempt_at"
        " THEN lease_until ELSE next_attempt_at END)"
        " FROM webhook_deliveries WHERE state = 'pending'"
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def delivered(db: Db, owner: str, event_id: str, *, now: float, url: str, status: int) -> bool:
    """The receiver took it (a 2xx); False when ``owner`` no longer held the row."""
    with db.write():
        return bool(
            db.execute(
                "UPDATE webhook_deliveries SET state = 'delivered', attempts = attempts + 1,"
                " owner = NULL, lease_until = NULL, url = ?, last_status = ?,"
                " last_error = NULL, updated_at = ?, delivered_at = ?"
                " WHERE id = ? AND owner = ? AND state = 'pending'",
                (url, status, now, now, event_id, owner),
            ).rowcount
        )


def attempt_failed(
    db: Db,
    owner: str,
    event_id: str,
    *,
    now: float,
    url: str | None,
    status: int | None,
    error: str,
    retry_at: float | None,
) -> bool:
    """One more failed attempt: due again at ``retry_at``, or ``failed`` for good when it
    is None. False when ``owner`` no longer held the row."""
    state = "pending" if retry_at is not None else "failed"
    with db.write():
        return bool(
            db.execute(
                "UPDATE webhook_deliveries SET state = ?, attempts = attempts + 1,"
                " owner = NULL, lease_until = NULL, next_attempt_at = COALESCE(?, next_attempt_at),"
                " url = ?, last_status = ?, last_error = ?, updated_at = ?"
                " WHERE id = ? AND owner = ? AND state = 'pending'",
                (state, retry_at, url, status, error[:MAX_ERROR_CHARS], now, event_id, owner),
            ).rowcount
        )


def release(db: Db, owner: str) -> int:
    """Every row ``owner`` holds, claimable again at once (a sender that stops)."""
    with db.write():
        return int(
            db.execute(
                "UPDATE webhook_deliveries SET owner = NULL, lease_until = NULL"
                " WHERE owner = ? AND state = 'pending'",
                (owner,),
            ).rowcount
        )


_LOG_COLUMNS = (
    "id, type, batch_id, tenant, endpoint, state, attempts, url, last_status, last_error,"
    " created_at, updated_at, next_attempt_at, delivered_at, payload"
)


def log(
    db: Db,
    *,
    batch_id: str | None = None,
    tenant: str | None = None,
    state: str | None = None,
    limit: int = 100,
) -> list[DeliveryRecord]:
    """The newest ``limit`` rows matching every filter given (``tenant`` is the store's
    key: ``""`` for the open gateway)."""
    where, params = ["1 = 1"], []
    for column, value in (("batch_id", batch_id), ("tenant", tenant), ("state", state)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    rows = db.execute(
        f"SELECT {_LOG_COLUMNS} FROM webhook_deliveries WHERE {' AND '.join(where)}"
        " ORDER BY seq DESC LIMIT ?",
        (*params, limit),
    ).fetchall()
    return [_record(row) for row in rows]


def _record(row: Any) -> DeliveryRecord:
    (event_id, event, batch_id, tenant, endpoint, state, attempts, url) = row[:8]
    (last_status, last_error, created, updated, next_at, delivered_at, payload) = row[8:]
    return DeliveryRecord(
        id=event_id,
        type=event,
        batch_id=batch_id,
        tenant=tenant or None,
        endpoint=endpoint,
        state=state,
        attempts=attempts,
        url=url,
        last_status=last_status,
        last_error=last_error,
        created_at=created,
        updated_at=updated,
        next_attempt_at=next_at if state == "pending" else None,
        delivered_at=delivered_at,
        payload=msgspec.Raw(bytes(payload)),
    )


def sweep(db: Db, *, before: float) -> int:
    """Delete the log's ended rows last touched before ``before``; how many."""
    with db.write():
        return int(
            db.execute(
                "DELETE FROM webhook_deliveries WHERE state != 'pending' AND updated_at < ?",
                (before,),
            ).rowcount
        )


def backoff_s(failures: int, *, base_s: float, cap_s: float, rng: random.Random) -> float:
    """The wait after the ``failures``-th failed attempt (1, 2, …): ``base_s`` doubled per
    earlier failure, plus up to ``JITTER`` of it, at most ``cap_s``. Below the cap each
    wait is longer than the one before, whatever the jitter (2x > 1.25x)."""
    exponent = min(max(failures - 1, 0), 62)  # no float overflow on absurd counts
    delay = base_s * 2.0**exponent
    return float(min(cap_s, delay * (1.0 + JITTER * rng.random())))
