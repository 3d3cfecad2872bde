"""The provider-batch loop: batches that run through a provider's own batch API
(``provider_route``), one gateway per batch (docs/batches.md, "Through the provider's
batch API").

Beside the runner's loops, one per gateway: claim a provider batch whole
(``policies.jobs.remote``: every open item under the runner's owner and lease, renewed by
its heartbeat, handed back by its ``release``), then drive it in a task:

1. Not submitted yet: convert each request for the provider (a body it cannot express is
   that request's 400), submit, record the provider's batch id (guarded: a gateway that
   lost the batch meanwhile cancels what it just made). A submit the provider refuses or
   cannot take now (5xx, 429, a network error) is tried again after a back-off
   (``2**attempts`` s, at most ``max_retry_delay_s``); the batch is not lost.
   Cancelled or expired before that: the items are handed back and dropped as usual.
2. Submitted (also after a restart: the id is in the store): poll every
   ``provider_poll_interval_s``; once our batch is cancelled or past its window, cancel
   the provider's (once per drive); when the provider's batch ended, read its results.
3. Record: the ledger rows first (idempotent: ids derived from the batch and line), then
   every item's line and state in one transaction (``provider_results``), then wake the
   bookkeeping to finalize.

A batch whose first alias no longer resolves to its provider goes back to the item-by-item
path when it was not submitted yet; once submitted, it waits for the provider to return
(or, when cancelled or expired, its requests are failed as never run).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import msgspec
import structlog

from core.config_batch import BatchConfig
from core.errors import GatewayError
from core.remote_batch import RemoteResult, RemoteStatus
from core.tenancy import Principal
from gateway.jobs.provider_results import remote_custom_id, settle
from gateway.jobs.provider_route import BatchApi, api_for, target_of
from gateway.process.state import GatewayState
from policies.jobs import JobStore
from policies.jobs.objects import DROPPED
from policies.jobs.remote import RemoteClaim
from routers.targets import Target

_log = structlog.get_logger("switchyard")


class ProviderBatches:
    """Claims and drives this gateway's provider batches (see the module docstring).
    ``principal`` maps a batch's stored creator to the one to bill now; ``settled`` is
    called when a batch's items are all recorded (finalize it)."""

    def __init__(
        self,
        state: GatewayState,
        store: JobStore,
        owner: str,
        settings: Callable[[], BatchConfig],
        principal: Callable[[Principal], Principal],
        settled: Callable[[], None],
    ) -> None:
        self.state, self.store, self.owner = state, store, owner
        self.settings, self.principal, self.settled = settings, principal, settled
        self._wake = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        self._drives: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._loop = asyncio.create_task(self._claims())

    def wake(self) -> None:
        self._wake.set()

    async def aclose(self) -> None:
        """Stop claiming and driving; the items stay leased to the owner for the runner's
        ``release`` (a submitted batch is polled again by whoever claims it next)."""
        tasks = [*self._drives, *([self._loop] if self._loop else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _claims(self) -> None:
        while True:
            claimed: RemoteClaim | None = None
            try:
                claimed = await self.store.claim_remote(self.owner, self.settings().lease_s)
            except asyncio.CancelledError:
                raise
            except Exception:
                _log.exception("batch.provider_claim_failed")
            if claimed is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.settings().poll_interval_s)
                self._wake.clear()
                continue
            task = asyncio.create_task(self._drive(claimed))
            self._drives.add(task)
            task.add_done_callback(self._drives.discard)

    async def _drive(self, claim: RemoteClaim) -> None:
        try:
            await self._run(claim)
        except asyncio.CancelledError:
            raise
        except Exception:
            _log.exception("batch.provider_failed", batch_id=claim.batch_id)
            with contextlib.suppress(Exception):
                await self.store.back_off_remote(self.owner, claim.batch_id, self._delay(claim))

    def _delay(self, claim: RemoteClaim) -> float:
        return min(self.settings().max_retry_delay_s, float(2 ** min(claim.attempts, 16)))

    async def _run(self, claim: RemoteClaim) -> None:
        runtime = self.state.runtime
        target = target_of(runtime, claim.provider, [item.body for item in claim.items])
        api = api_for(runtime, target) if target is not None else None
        if target is None or api is None:
            await self._provider_gone(claim)
            return
        remote_id = claim.provider_batch_id
        prepared, refused = _prepare(api, claim, target)
        if remote_id is None:
            if claim.closing is not None:  # stopped before it was sent: dropped as usual
                await self.store.back_off_remote(self.owner, claim.batch_id, 0.0)
                self.settled()
                return
            if not prepared:  # nothing the provider could take
                await self._record(claim, target, {}, refused, _missing(claim.closing, None))
                return
            remote_id = await self._submit(claim, api, prepared)
            if remote_id is None:
                return
        status = await self._poll(claim.batch_id, api, remote_id)
        results: dict[str, RemoteResult] = {}
        if status.state == "ended":
            bodies = {remote_custom_id(i.line): i.body for i in claim.items}
            results = await api.results(remote_id, bodies, int(self.state.clock.wall()))
        closing = await self.store.remote_closing(claim.batch_id)
        await self._record(claim, target, results, refused, _missing(closing, status))

    async def _submit(
        self, claim: RemoteClaim, api: BatchApi, prepared: list[tuple[str, bytes]]
    ) -> str | None:
        try:
            remote_id = await api.submit(prepared, claim.batch_id)
        except Exception as exc:  # refused for now (5xx, 429, network): try again later
            delay = self._delay(claim)
            _log.warning(
                "batch.provider_submit_failed",
                batch_id=claim.batch_id,
                provider=claim.provider,
                error=str(exc),
                retry_in_s=delay,
            )
            await self.store.back_off_remote(self.owner, claim.batch_id, delay)
            return None
        if not await self.store.record_remote_id(self.owner, claim.batch_id, remote_id):
            _log.warning("batch.provider_lease_lost", batch_id=claim.batch_id)
            with contextlib.suppress(Exception):
                await api.cancel(remote_id)
            return None
        _log.info(
            "batch.provider_submitted",
            batch_id=claim.batch_id,
            provider=claim.provider,
            provider_batch_id=remote_id,
            requests=len(prepared),
        )
        return remote_id

    async def _poll(self, batch_id: str, api: BatchApi, remote_id: str) -> RemoteStatus:
        cancel_sent = False
        while True:
            if not cancel_sent and await self.store.remote_closing(batch_id) is not None:
                cancel_sent = True  # once per drive; a restart sends it again
                try:
                    await api.cancel(remote_id)
                except Exception as exc:
                    _log.warning("batch.provider_cancel_failed", batch_id=batch_id, error=str(exc))
            try:
                status = await api.status(remote_id)
            except Exception as exc:  # the provider is unreachable now: poll again
                _log.warning("batch.provider_poll_failed", batch_id=batch_id, error=str(exc))
            else:
                if status.state != "running":
                    return status
            await asyncio.sleep(self.settings().provider_poll_interval_s)

    async def _record(
        self,
        claim: RemoteClaim,
        target: Target | None,
        results: dict[str, RemoteResult],
        refused: dict[int, RemoteResult],
        missing: RemoteResult,
    ) -> None:
        settings = self.settings()
        done = settle(
            claim,
            target,
            results,
            refused=refused,
            missing=missing,
            principal=self.principal(claim.principal),
            discount=settings.discount,
            wall=self.state.clock.wall(),
        )
        for row in done.rows:
            await self.state.ledger.append(row)
        written = await self.store.finish_remote(
            self.owner, claim.batch_id, done.outcomes, done.model
        )
        if not written:
            _log.warning("batch.provider_lease_lost", batch_id=claim.batch_id)
            return
        # After the store took the results, so a retry never charges twice (a gateway that
        # dies in between leaves this usage uncharged; the ledger has it).
        tokens = sum(row.prompt_tokens + row.completion_tokens for row in done.rows)
        cost = sum(row.cost_usd for row in done.rows)
        principal = self.principal(claim.principal)
        await self.state.runtime.quotas.charge(principal, tokens, cost, claim.batch_id)
        _log.info("batch.provider_recorded", batch_id=claim.batch_id, answered=len(done.rows))
        self.settled()

    async def _provider_gone(self, claim: RemoteClaim) -> None:
        if claim.provider_batch_id is None and await self.store.unroute_remote(
            self.owner, claim.batch_id
        ):
            _log.info("batch.provider_unrouted", batch_id=claim.batch_id, provider=claim.provider)
            self.settled()
            return
        if claim.closing is not None:  # nobody can ask the provider: never ran, as dropped
            await self._record(claim, None, {}, {}, _missing(claim.closing, None))
            return
        _log.warning("batch.provider_unavailable", batch_id=claim.batch_id, provider=claim.provider)
        await self.store.back_off_remote(
            self.owner, claim.batch_id, self.settings().provider_poll_interval_s
        )


def _prepare(
    api: BatchApi, claim: RemoteClaim, target: Target
) -> tuple[list[tuple[str, bytes]], dict[int, RemoteResult]]:
    """The requests in the provider's form, and the 400 of each it cannot express."""
    prepared: list[tuple[str, bytes]] = []
    refused: dict[int, RemoteResult] = {}
    for item in claim.items:
        try:
            prepared.append((remote_custom_id(item.line), api.prepare(item.body, target.model)))
        except (GatewayError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            message = exc.message if isinstance(exc, GatewayError) else str(exc)
            param = exc.param if isinstance(exc, GatewayError) else None
            error = {"message": message, "type": "invalid_request_error", "param": param}
            body = {"error": {**error, "code": None}}
            refused[item.line] = RemoteResult(status_code=400, body=msgspec.json.encode(body))
    return prepared, refused


def _missing(closing: str | None, status: RemoteStatus | None) -> RemoteResult:
    """What a request with no result from the provider gets."""
    if status is not None and status.state == "failed":
        return RemoteResult(error_code=status.code, error_message=status.message)
    why = closing or (status.status if status is not None else None)
    if why is not None and why in DROPPED:
        dropped = DROPPED[why]
        return RemoteResult(error_code=dropped.code, error_message=dropped.message)
    return RemoteResult(
        error_code="provider_result_missing",
        error_message="The provider's batch ended without a result for this request.",
    )
