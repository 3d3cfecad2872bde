"""``GET /admin/webhook_deliveries`` (admin key only): the batch webhooks' delivery log,
newest first: each event, where it went, how many attempts, the last status or error,
and its state (pending, delivered, failed). Not an OpenAI route: webhooks are the
operator's configuration (``batch.webhooks``), and so is their log."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, get

from core.errors import InvalidRequestError
from gateway.http.guard import require_admin
from gateway.jobs.api import runner_of

PATH = "/admin/webhook_deliveries"
STATES = ("pending", "delivered", "failed")
MAX_LIMIT = 1000
_JSON = "application/json"


@get(PATH)
async def webhook_deliveries(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Filters: ``batch_id``, ``tenant`` (a tenant's name), ``state``; ``limit`` 1 to
    1000 (default 100)."""
    require_admin(request)
    params = request.query_params
    state = params.get("state") or None
    if state is not None and state not in STATES:
        raise InvalidRequestError(
            f"state must be one of: {', '.join(STATES)}.", param="state", code="invalid_value"
        )
    rows = await runner_of(request).store.deliveries(
        batch_id=params.get("batch_id") or None,
        tenant=params.get("tenant") or None,
        state=state,
        limit=_limit(params.get("limit")),
    )
    body = msgspec.json.encode({"object": "list", "data": rows})
    return Response(body, media_type=_JSON, headers={"cache-control": "no-store"})


def _limit(raw: str | None) -> int:
    try:
        limit = 100 if raw is None else int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequestError(
            f"limit must be an integer from 1 to {MAX_LIMIT}.", param="limit", code="invalid_value"
        )
    return limit
