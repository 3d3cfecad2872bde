"""Who a batch item's request runs for.

The batch runner (``gateway/jobs``) sends each item through the gateway's own ASGI app, in
process, with a ``BatchCaller`` in the ASGI scope's state under ``BATCH_KEY``. ``Scope``
then takes the caller's identity from it instead of from headers (the batch's creator
authenticated when it created the batch; the runner holds no credential), and prices the
request at the batch discount. Only an in-process call can put an object there: an HTTP
client's headers and body never reach the scope's state, so the identity cannot be forged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec
from litestar import Request

from core.errors import ServiceUnavailableError
from core.routing import RouteRequest
from core.tenancy import Principal
from policies.admission import BATCH_NO_ROOM
from routers.targets import Target

RETRY_S = 5.0  # when a batch item that found no room is tried again (at the earliest)

BATCH_KEY = "switchyard.batch"
# The engine priority a batch item's calls carry (interactive: 0; lower runs first). An
# engine that schedules by priority pauses batch items while interactive requests run.
BATCH_PRIORITY = 1


class BatchCaller(NamedTuple):
    """The batch's creator and the batch an item belongs to; ``local_first``: run it on
    the alias's local targets only (when it has any), the batch's deadline being far."""

    principal: Principal
    batch_id: str
    local_first: bool = False


def local_first(created_at: float, expires_at: float, now: float, managed_after: float) -> bool:
    """Whether an item of a batch created at ``created_at`` and due at ``expires_at`` is
    still in the local-only part of its window (the first ``managed_after`` share)."""
    return now < created_at + (expires_at - created_at) * managed_after


def batch_caller(request: Request[Any, Any, Any]) -> BatchCaller | None:
    """The caller the batch runner put in ``request``'s ASGI state, else None."""
    caller = request.scope.get("state", {}).get(BATCH_KEY)
    return caller if isinstance(caller, BatchCaller) else None


def batch_route(
    route: RouteRequest, caller: BatchCaller | None, targets: Sequence[Target]
) -> RouteRequest:
    """``route`` restricted to local targets for an item still in the local-only part of
    its window, when the alias has a local target (else unchanged: nothing else could run
    it)."""
    if caller is None or not caller.local_first or not any(t.local for t in targets):
        return route
    return msgspec.structs.replace(route, local_only=True)


def no_room_for_batch() -> ServiceUnavailableError:
    """A batch item never waits in the admission queue (interactive requests stay ahead of
    batch work): it is answered 503 and the runner tries it again later."""
    error = ServiceUnavailableError(
        "No target has room for this batch item now; it is tried again later.",
        retry_after=RETRY_S,
    )
    error.refused_by = BATCH_NO_ROOM
    return error
