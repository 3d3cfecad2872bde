"""The Files and Batch APIs' own errors, in the gateway's error tree (``core.errors``):
rendered in OpenAI's shape like every other ``GatewayError``."""

from __future__ import annotations

from core.errors import GatewayError, ServiceUnavailableError
from policies.store.base import StoreUnavailableError


class NotFoundError(GatewayError):
    """No such object *for this tenant*: another tenant's id reads the same as an id that
    never existed (a 403 would tell the caller the id is real)."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ConflictError(GatewayError):
    """The object is in a state that forbids the action (cancel a completed batch)."""

    status = 409
    type = "invalid_request_error"
    code = "conflict"


def no_file(file_id: str, param: str = "file_id") -> NotFoundError:
    return NotFoundError(f"No such File object: {file_id}", param=param)


def no_batch(batch_id: str) -> NotFoundError:
    return NotFoundError(f"No batch found with id '{batch_id}'.", param="batch_id")


class JobStoreUnavailableError(ServiceUnavailableError, StoreUnavailableError):
    """The job store's database cannot be reached now (Postgres down, restarting, a
    standby after a failover). A ``GatewayError``, so every route that touches the store
    answers 503 in OpenAI's shape with ``retry-after``; a ``StoreUnavailableError``, so code
    that handles shared-state outages recognises it. Nothing was written. ``reason`` (for
    logs only: it names the database's host) says what failed."""

    reason: str = ""
