"""The Files and Batch APIs' own errors, in the gateway's error tree (``core.errors``):
rendered in OpenAI's shape like every other ``GatewayError``."""

from __future__ import annotations

from core.errors import GatewayError


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
