"""Who a batch item's request runs for.

The batch runner (``gateway/jobs``) sends each item through the gateway's own ASGI app, in
process, with a ``BatchCaller`` in the ASGI scope's state under ``BATCH_KEY``. ``Scope``
then takes the caller's identity from it instead of from headers (the batch's creator
authenticated when it created the batch; the runner holds no credential), and prices the
request at the batch discount. Only an in-process call can put an object there: an HTTP
client's headers and body never reach the scope's state, so the identity cannot be forged.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from litestar import Request

from core.tenancy import Principal

BATCH_KEY = "switchyard.batch"


class BatchCaller(NamedTuple):
    """The batch's creator and the batch an item belongs to."""

    principal: Principal
    batch_id: str


def batch_caller(request: Request[Any, Any, Any]) -> BatchCaller | None:
    """The caller the batch runner put in ``request``'s ASGI state, else None."""
    caller = request.scope.get("state", {}).get(BATCH_KEY)
    return caller if isinstance(caller, BatchCaller) else None
