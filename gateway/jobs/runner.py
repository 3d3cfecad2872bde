"""The batch runner: claims items from the job store and runs each through the gateway's
own app, at low priority.

One runner per gateway process, started by the app's lifespan (``open_jobs``) and stopped
before the state drains. Three loops and a sender:

- **work**: (1) *yield*: no new claim while this gateway has more than
  ``yield_above_in_flight`` interactive requests in flight (the runner's own are not
  interactive), any request waits in the admission queue, or, with
  ``yield_above_in_flight: 0``, within ``yield_quiet_s`` of the last interactive request's
  end; running items finish,
  so interactive traffic gets the capacity back within one item's duration; (2) wait for
  a free slot (``concurrency`` items at once); (3) claim what the slots can take
  (``policies.jobs.work``: leased, so replicas sharing the store never run one item twice
  while its runner lives) and run each in a task; (4) when nothing was claimable, sleep
  until woken or ``poll_interval_s``.
- **books** (``housekeeping``): validate new batches, expire, drop, finalize, sweep; at
  once when something changed here (a batch created or cancelled, a batch's last item
  settled), else every ``poll_interval_s`` (for other replicas' changes). Apart from the
  work loop, so a yielding runner still validates, expires and finalizes.
- **heartbeat**: renews this runner's leases every third of ``lease_s``.
- **webhooks** (``webhooks.WebhookSender``): sends the batch events the store queued
  with each status change (``batch.webhooks``); woken when bookkeeping changed a status.
- **provider batches** (``provider_batches.ProviderBatches``): batches routed to a
  provider's own batch API (``provider_route``) are claimed whole, submitted and polled
  there; their items never enter the work loop.

An item's answer is final unless it is a 429 or a 503 (a quota, the queue, an upstream
that rate-limits, no target right now): then the item goes back to pending and waits
``Retry-After`` or an exponential back-off (at most ``max_retry_delay_s``); the
completion window bounds how long. ``aclose`` stops claiming, lets running items finish
for up to the drain timeout, cancels the rest and releases every item it still holds, so
another runner (or this one after a restart) picks them up at once; a runner killed
outright leaves its items to be re-claimed when their leases run out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
from typing import Any

import structlog
from litestar.types import ASGIApp

from core.config_batch import BatchConfig
from core.tenancy import Principal
from gateway.jobs import housekeeping
from gateway.jobs.inprocess import Answer, call_app, internal_failure
from gateway.jobs.provider_batches import ProviderBatches
from gateway.jobs.webhooks import WebhookSender
from gateway.process.state import GatewayState
from gateway.request.batch import BatchCaller, local_first
from policies.jobs import JobStore, job_store
from policies.jobs.objects import answered_line
from policies.jobs.usage import item_usage, requested_model
from policies.jobs.work import Claim
from policies.store.base import StoreUnavailableError

_log = structlog.get_logger("switchyard")
RETRY_STATUSES = frozenset({429, 503})  # refused for now: the item is tried again later
YIELD_CHECK_S = 0.05  # how often a yielding runner looks at the traffic again


class BatchRunner:
    """Runs the store's batch items through ``app`` (the gateway's ASGI app)."""

    def __init__(self, app: ASGIApp, state: GatewayState, store: JobStore) -> None:
        self.app = app
        self.state = state
        self.store = store
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._tasks: set[asyncio.Task[None]] = set()
        # Items whose result could not be stored, by (batch id, line), until handed back.
        self._orphans: dict[tuple[str, int], Claim] = {}
        # Claims and hand-backs of orphans take turns: a hand-back (``retry_later``, which
        # matches the owner only) landing after this runner claimed the same item again
        # would release the new hold mid-run, and the item would run a third time.
        self._holds = asyncio.Lock()
        self._wake = asyncio.Event()  # new work may be claimable
        self._books = asyncio.Event()  # bookkeeping is due
        self._slot = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self._last_sweep = -float("inf")
        self.webhooks = WebhookSender(
            store, state.client, lambda: self.settings, state.env, self.owner
        )
        self.remote = ProviderBatches(
            state, store, self.owner, lambda: self.settings, self._principal, self._changed
        )

    @property
    def settings(self) -> BatchConfig:
        return self.state.runtime.config.batch

    def start(self) -> None:
        self.store.webhooks = self.settings.webhooks
        loops = (self._work(), self._keep_books(), self._heartbeat())
        self._loops = [asyncio.create_task(loop) for loop in loops]
        self.webhooks.start()
        self.remote.start()

    def wake(self) -> None:
        """Something changed here (a batch created or cancelled): look now."""
        self._books.set()
        self._wake.set()
        self.webhooks.wake()  # a cancel may have queued an event
        self.remote.wake()

    def _changed(self) -> None:
        """A provider batch's items were recorded or handed back: finalize, claim."""
        self._books.set()
        self._wake.set()

    async def aclose(self, grace_s: float) -> None:
        """Stop claiming; give running items ``grace_s`` to finish; cancel the rest and
        release every item still held. The webhook sender stops alongside (its queued
        events stay in the store for the next start)."""
        sender = asyncio.create_task(self.webhooks.aclose(grace_s))
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        await self.remote.aclose()  # its batches are released below with the items
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace_s)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # A store that cannot be reached now must not stop the shutdown (the state's own
        # drain comes after): what this runner holds comes back when its leases run out.
        try:
            released = await self.store.release(self.owner)
            if released:
                _log.info("batch.released", items=released)
        except StoreUnavailableError as exc:
            _log.warning("batch.release_failed", error=str(exc))
        try:
            await sender
        except StoreUnavailableError as exc:
            _log.warning("batch.webhooks_release_failed", error=str(exc))

    # -- the loop -------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            try:
                await self._turn()
            except asyncio.CancelledError:
                raise
            except Exception:  # the store failed: log, wait, try again
                _log.exception("batch.runner_failed")
                await _wait(self._wake, self.settings.poll_interval_s)

    async def _turn(self) -> None:
        await self._until_quiet()
        await self._until_slot()
        settings = self.settings
        self.store.retention_s = settings.retention_s
        self.store.webhooks = settings.webhooks
        free = settings.concurrency - len(self._tasks)
        async with self._holds:
            claims = await self.store.claim(self.owner, free, settings.lease_s)
            for item in claims:
                # An orphan whose lease ran out and that this runner claimed again is held
                # afresh: handing the old hold back would release the new one mid-run.
                self._orphans.pop(_key(item), None)
        for item in claims:
            task = asyncio.create_task(self._run(item))
            self._tasks.add(task)
            task.add_done_callback(self._done)
        if not claims:
            await _wait(self._wake, settings.poll_interval_s)

    async def _keep_books(self) -> None:
        while True:
            try:
                await self._bookkeeping()
            except asyncio.CancelledError:
                raise
            except Exception:
                _log.exception("batch.bookkeeping_failed")
            await _wait(self._books, self.settings.poll_interval_s)

    async def _bookkeeping(self) -> None:
        self.store.webhooks = self.settings.webhooks
        if await housekeeping.validate(self.store, self.state.runtime):
            self._wake.set()  # a batch started: its items are claimable
            self.remote.wake()  # or the batch itself, when a provider's batch API runs it
            self.webhooks.wake()  # and batch.in_progress / batch.failed may be queued
        if await housekeeping.settle(self.store):
            self.webhooks.wake()  # each finalized batch queued its event
        now = self.state.clock.now()
        if now - self._last_sweep >= self.settings.sweep_interval_s:
            self._last_sweep = now
            await housekeeping.sweep(self.store)

    def busy(self) -> bool:
        """Whether interactive traffic should have this gateway to itself for now: more
        than ``yield_above_in_flight`` interactive requests in flight, any request queued,
        or (with none allowed beside batch work) the last one ended less than
        ``yield_quiet_s`` ago (interactive traffic comes in bursts: a gap between two of
        its requests is not room for batch work that would then share the engine with
        the next)."""
        settings, in_flight = self.settings, self.state.in_flight
        if in_flight.interactive > settings.yield_above_in_flight or self.state.queue.depth > 0:
            return True
        quiet = settings.yield_quiet_s if settings.yield_above_in_flight == 0 else 0.0
        return in_flight.interactive_quiet_for() < quiet

    async def _until_quiet(self) -> None:
        while self.busy():
            await asyncio.sleep(YIELD_CHECK_S)

    async def _until_slot(self) -> None:
        while len(self._tasks) >= self.settings.concurrency:
            self._slot.clear()
            await self._slot.wait()

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slot.set()
        if not task.cancelled() and task.exception() is not None:
            _log.error("batch.item_crashed", exc_info=task.exception())

    # -- one item -------------------------------------------------------------------------

    async def _run(self, item: Claim) -> None:
        now, share = self.state.clock.wall(), self.settings.managed_after
        first = local_first(item.created_at, item.expires_at, now, share)
        caller = BatchCaller(self._principal(item.principal), item.batch_id, first)
        try:
            answer = await call_app(self.app, item.url, item.body, caller, item.custom_id)
        except Exception:
            _log.exception("batch.item_failed", batch_id=item.batch_id, line=item.line)
            answer = internal_failure()
        try:
            await self._record(item, answer)
        except Exception:
            _log.exception("batch.result_not_stored", batch_id=item.batch_id, line=item.line)
            self._orphans[_key(item)] = item  # handed back by the heartbeat

    def _principal(self, stored: Principal) -> Principal:
        """The batch's creator as the control plane knows its key now (the key's models,
        tags and own limits apply to the items as to its requests); the stored one
        without a control plane or for another kind of caller."""
        control = self.state.control
        if control is None or stored.via != "api_key" or stored.key_id is None:
            return stored
        live = control.index.principal(stored.key_id)
        return live if live is not None and live.tenant == stored.tenant else stored

    async def _record(self, item: Claim, answer: Answer) -> None:
        if answer.status in RETRY_STATUSES:
            await self.store.retry_later(self.owner, item, self._delay(item, answer))
            return
        line = answered_line(item.custom_id, answer.status, answer.request_id, answer.body)
        ok = 200 <= answer.status < 300
        written, settled = await self.store.finish(
            self.owner,
            item,
            ok=ok,
            result=line,
            usage=item_usage(answer.body),
            model=requested_model(item.body),
        )
        if not written:  # the lease was lost and the item taken over: its result wins
            _log.warning("batch.lease_lost", batch_id=item.batch_id, line=item.line)
        if settled:
            self._books.set()  # finalize it now

    def _delay(self, item: Claim, answer: Answer) -> float:
        backoff = float(2 ** min(item.attempts, 16))
        wanted = answer.retry_after_s() or backoff
        return min(self.settings.max_retry_delay_s, max(1.0, wanted))

    # -- leases ---------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_s / 3)
            try:
                await self._hand_back_orphans()
                await self.store.renew(self.owner, self.settings.lease_s)
            except Exception:
                _log.exception("batch.renew_failed")

    async def _hand_back_orphans(self) -> None:
        async with self._holds:
            for key, item in list(self._orphans.items()):
                await self.store.retry_later(self.owner, item, 0.0)
                del self._orphans[key]


def _key(item: Claim) -> tuple[str, int]:
    return item.batch_id, item.line


async def _wait(event: asyncio.Event, timeout_s: float) -> None:
    """Until ``event`` is set (then clear it) or ``timeout_s`` passed."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)
    event.clear()


async def open_jobs(app: Any, state: GatewayState) -> BatchRunner:
    """Open the job store the config names and start this process's runner. A Postgres
    store that cannot be reached now is logged, not fatal: the routes answer 503 and the
    runner retries until it is back."""
    store = job_store(state.runtime.config, state.clock, state.env)
    try:
        await store.open()
    except StoreUnavailableError:
        _log.warning("batch.store_unavailable_at_start")  # the store logged why
    runner = BatchRunner(app, state, store)
    runner.start()
    return runner


async def close_jobs(runner: BatchRunner, state: GatewayState) -> None:
    """Stop the runner (running items get the drain timeout) and close the store."""
    await runner.aclose(state.runtime.config.server.drain_timeout_s)
    await runner.store.aclose()
