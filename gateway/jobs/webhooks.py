"""Webhook delivery: sends the job store's queued batch events (``policies.jobs.outbox``)
to the URLs the operator configured (``batch.webhooks``), signed as Standard Webhooks
(the scheme OpenAI's webhooks use), with retries and a delivery log.

- **Signature**: headers ``webhook-id`` (the event's id, the same on every attempt),
  ``webhook-timestamp`` (this attempt's Unix seconds) and ``webhook-signature``:
  ``v1,`` + base64 HMAC-SHA256 of ``{id}.{timestamp}.{body}`` under the secret's bytes (the
  secret is ``whsec_`` + base64 of them). OpenAI's ``client.webhooks.unwrap`` and the
  ``standardwebhooks`` libraries verify it as it is.
- **Outcome**: a 2xx answer is delivered. Anything else (another status, 3xx included:
  redirects are not followed; a timeout; a refused connection; a secret that is not set)
  is a failed attempt, tried again after ``outbox.backoff_s`` (or the receiver's
  ``Retry-After`` when longer) until ``batch.webhook_max_attempts``; then the event is
  ``failed``. A 410 Gone fails it at once (the receiver wants no more).
- **Sharing**: one sender per gateway process, next to the batch runner; rows are claimed
  under a lease longer than an attempt may last, so replicas sharing the store never send
  one attempt twice; a stopped sender hands its rows back at once.

The URL and secret are read from the current config at each attempt, so a reload that
fixes a wrong URL applies to the retries; an event whose webhook entry was removed fails.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import random
from collections.abc import Callable, Mapping
from typing import NamedTuple

import httpx
import structlog

from core.config_batch import BatchConfig
from policies.jobs import JobStore
from policies.jobs.outbox import Delivery, backoff_s
from providers.http import parse_retry_after

_log = structlog.get_logger("switchyard")
SECRET_PREFIX = "whsec_"
KEY_BYTES = (24, 64)  # Standard Webhooks: at least 192 bits, at most 512
SEND_AT_ONCE = 16  # events one pass claims and sends concurrently
LEASE_MARGIN_S = 5.0  # a claim outlives its attempt's timeout by this much
MIN_WAIT_S = 0.01  # shortest sleep between passes (no spinning on a clock edge)
USER_AGENT = "Switchyard-Webhooks/1"


class SecretError(ValueError):
    """The signing secret is missing or not in Standard Webhooks' form."""


def decode_secret(text: str | None, env_name: str = "the secret") -> bytes:
    """The HMAC key in ``whsec_<base64>``; ``SecretError`` says what is wrong with it."""
    if not text:
        raise SecretError(f"environment variable {env_name} is not set")
    if not text.startswith(SECRET_PREFIX):
        raise SecretError(f"{env_name} must start with '{SECRET_PREFIX}' (then base64)")
    try:
        key = base64.b64decode(text[len(SECRET_PREFIX) :], validate=True)
    except binascii.Error as exc:
        raise SecretError(f"{env_name} is not valid base64 after '{SECRET_PREFIX}'") from exc
    low, high = KEY_BYTES
    if not low <= len(key) <= high:
        raise SecretError(f"{env_name} must hold {low} to {high} bytes, not {len(key)}")
    return key


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,<base64 HMAC-SHA256("{id}.{ts}.{body}")>``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def signed_headers(key: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """Everything one attempt sends besides the body."""
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(key, msg_id, timestamp, body),
    }


class Outcome(NamedTuple):
    """What one attempt got: the status (None: no answer), why it failed, and the
    receiver's ``Retry-After``."""

    status: int | None
    error: str | None = None
    retry_after_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class WebhookSender:
    """Delivers the store's due events until closed. ``settings`` returns the current
    ``batch`` config; ``env`` holds the secrets it names; ``owner`` marks this sender's
    claims (the batch runner's id)."""

    def __init__(
        self,
        store: JobStore,
        client: httpx.AsyncClient,
        settings: Callable[[], BatchConfig],
        env: Mapping[str, str],
        owner: str,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.client = client
        self.settings = settings
        self.env = env
        self.owner = owner
        self.rng = rng or random.Random()
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Check the configured secrets (a warning each bad one) and start sending."""
        for name, config in self.settings().webhooks.items():
            try:
                decode_secret(self.env.get(config.secret_env), config.secret_env)
            except SecretError as exc:
                _log.warning("batch.webhook_secret_unusable", webhook=name, problem=str(exc))
        self._task = asyncio.create_task(self._loop())

    def wake(self) -> None:
        """An event may have been queued here: look now."""
        self._wake.set()

    async def aclose(self, grace_s: float) -> None:
        """Stop claiming; give attempts in flight ``grace_s``; hand back every held row."""
        self._stopping = True
        self._wake.set()
        task = self._task
        if task is not None:
            done, _ = await asyncio.wait({task}, timeout=grace_s)
            if not done:
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        released = await self.store.release_deliveries(self.owner)
        if released:
            _log.info("batch.webhooks_released", events=released)

    # -- the loop -------------------------------------------------------------------------

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                wait_s = await self._pass()
            except asyncio.CancelledError:
                raise
            except Exception:  # the store failed: log, wait, try again
                _log.exception("batch.webhooks_failed")
                wait_s = self.settings().poll_interval_s
            if wait_s > 0 and not self._stopping:
                await _wait(self._wake, wait_s)

    async def _pass(self) -> float:
        """Send what is due; how long to sleep before the next pass (until the next event
        is due, at most ``poll_interval_s``: other replicas queue events too)."""
        poll_s = self.settings().poll_interval_s
        due_at = await self.store.next_delivery_at()
        if due_at is None:
            return poll_s
        wait_s = due_at - self.store.clock.wall()
        if wait_s <= 0 and await self.send_due():
            return 0.0  # more may be due right away
        return min(poll_s, max(wait_s, MIN_WAIT_S))

    async def send_due(self) -> int:
        """Claim up to ``SEND_AT_ONCE`` due events, send them concurrently and record each
        outcome; how many were claimed."""
        settings = self.settings()
        lease_s = settings.webhook_timeout_s + LEASE_MARGIN_S
        claimed = await self.store.claim_deliveries(self.owner, SEND_AT_ONCE, lease_s)
        await asyncio.gather(*(self._deliver(delivery, settings) for delivery in claimed))
        return len(claimed)

    # -- one event ------------------------------------------------------------------------

    async def _deliver(self, delivery: Delivery, settings: BatchConfig) -> None:
        try:
            config = settings.webhooks.get(delivery.endpoint)
            if config is None:
                gone = f"batch.webhooks has no entry '{delivery.endpoint}' any more"
                await self._failed(delivery, None, Outcome(None, gone), retry_in_s=None)
                return
            try:
                key = decode_secret(self.env.get(config.secret_env), config.secret_env)
            except SecretError as exc:
                outcome = Outcome(None, str(exc))  # nothing unsigned leaves the gateway
            else:
                outcome = await self._post(config.url, key, delivery, settings.webhook_timeout_s)
            if outcome.ok:
                await self._delivered(delivery, config.url, outcome)
            else:
                retry_in_s = self._retry_in(delivery.attempts + 1, outcome, settings)
                await self._failed(delivery, config.url, outcome, retry_in_s=retry_in_s)
        except Exception:  # one event's trouble must not stop the others
            _log.exception("batch.webhook_crashed", event_id=delivery.id)

    async def _post(self, url: str, key: bytes, delivery: Delivery, timeout_s: float) -> Outcome:
        """One signed POST, bounded by ``timeout_s`` as a whole; the answer's body is not
        read (a receiver cannot make the gateway download anything)."""
        timestamp = int(self.store.clock.wall())
        headers = signed_headers(key, delivery.id, timestamp, delivery.payload)
        try:
            async with asyncio.timeout(timeout_s):
                request = self.client.stream(
                    "POST", url, content=delivery.payload, headers=headers, timeout=timeout_s
                )
                async with request as response:
                    status = response.status_code
                    retry_after = parse_retry_after(response.headers)
        except TimeoutError:
            return Outcome(None, f"no answer within {timeout_s:g}s")
        except httpx.HTTPError as exc:
            return Outcome(None, f"{type(exc).__name__}: {exc}")
        if 200 <= status < 300:
            return Outcome(status)
        return Outcome(status, f"the receiver answered {status}", retry_after)

    async def _delivered(self, delivery: Delivery, url: str, outcome: Outcome) -> None:
        assert outcome.status is not None
        if await self.store.delivered(self.owner, delivery.id, url=url, status=outcome.status):
            _log.info(
                "batch.webhook_delivered",
                event_id=delivery.id,
                type=delivery.type,
                batch_id=delivery.batch_id,
                attempts=delivery.attempts + 1,
            )

    async def _failed(
        self, delivery: Delivery, url: str | None, outcome: Outcome, *, retry_in_s: float | None
    ) -> None:
        await self.store.delivery_failed(
            self.owner,
            delivery.id,
            url=url,
            status=outcome.status,
            error=outcome.error or "failed",
            retry_in_s=retry_in_s,
        )
        _log.warning(
            "batch.webhook_retry" if retry_in_s is not None else "batch.webhook_failed",
            event_id=delivery.id,
            type=delivery.type,
            batch_id=delivery.batch_id,
            attempts=delivery.attempts + 1,
            status=outcome.status,
            error=outcome.error,
            retry_in_s=retry_in_s,
        )

    def _retry_in(self, attempts: int, outcome: Outcome, settings: BatchConfig) -> float | None:
        """Seconds until the next attempt after ``attempts`` failed ones; None when they
        are all used, or the receiver answered 410 Gone."""
        if attempts >= settings.webhook_max_attempts or outcome.status == 410:
            return None
        cap_s = settings.webhook_max_retry_delay_s
        base_s = settings.webhook_retry_base_s
        delay = backoff_s(attempts, base_s=base_s, cap_s=cap_s, rng=self.rng)
        if outcome.retry_after_s is not None:
            delay = max(delay, min(cap_s, outcome.retry_after_s))
        return delay


async def _wait(event: asyncio.Event, timeout_s: float) -> None:
    """Until ``event`` is set (then clear it) or ``timeout_s`` passed."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)
    event.clear()
