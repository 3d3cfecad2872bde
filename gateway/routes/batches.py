"""OpenAI's Batch API: ``POST /v1/batches``, ``GET /v1/batches``, ``GET /v1/batches/{id}``,
``POST /v1/batches/{id}/cancel``. A batch is created ``validating``; the runner
(gateway/jobs) validates it against the config of that moment and runs its items at low
priority; the batch object tells where it stands. Tenant-scoped like the Files API."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, get, post

from core.config_batch import window_seconds
from core.errors import InvalidRequestError
from gateway.http.errors import decode_body
from gateway.http.guard import authenticate
from gateway.jobs.api import answer, page_params, runner_of, unknown_cursor
from policies.jobs.errors import no_batch
from policies.jobs.files import UnknownCursor
from policies.jobs.objects import ENDPOINTS, BatchCreate

PATH = "/v1/batches"
_decoder = msgspec.json.Decoder(BatchCreate)


@post(PATH, status_code=200)
async def create_batch(request: Request[Any, Any, Any]) -> Response[bytes]:
    principal = authenticate(request)
    runner = runner_of(request)
    body: BatchCreate = decode_body(_decoder, await request.body())
    if body.endpoint not in ENDPOINTS:
        raise InvalidRequestError(
            f"Batches cannot use '{body.endpoint}'; use one of {', '.join(ENDPOINTS)}.",
            param="endpoint",
            code="invalid_value",
        )
    windows = runner.settings.completion_windows
    window_s = window_seconds(body.completion_window)
    if body.completion_window not in windows or window_s is None:
        raise InvalidRequestError(
            f"completion_window must be one of: {', '.join(windows)}.",
            param="completion_window",
            code="invalid_value",
        )
    created = await runner.store.create_batch(principal, body, window_s)
    runner.wake()  # validate it now rather than at the next poll
    return answer(created)


@get(PATH)
async def list_batches(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The caller's batches, newest first."""
    principal = authenticate(request)
    after, limit = page_params(request, default=20, maximum=100)
    try:
        page = await runner_of(request).store.batches(principal, after=after, limit=limit)
    except UnknownCursor as exc:
        raise unknown_cursor(str(exc)) from exc
    return answer(page)


@get(PATH + "/{batch_id:str}")
async def retrieve_batch(request: Request[Any, Any, Any], batch_id: str) -> Response[bytes]:
    principal = authenticate(request)
    found = await runner_of(request).store.batch(principal, batch_id)
    if found is None:
        raise no_batch(batch_id)
    return answer(found)


@post(PATH + "/{batch_id:str}/cancel", status_code=200)
async def cancel_batch(request: Request[Any, Any, Any], batch_id: str) -> Response[bytes]:
    """``cancelling`` at once (``cancelled`` for a batch still validating); ``cancelled``
    when its running items have finished."""
    principal = authenticate(request)
    runner = runner_of(request)
    cancelled = await runner.store.cancel(principal, batch_id)
    runner.wake()
    return answer(cancelled)
