"""The executor walks a plan: each target under tenacity (transient errors of that target
only), then the next target on errors whose class says ``fallback_ok``; a client error (400)
never fans out. Streams fall back only until their first chunk has arrived.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from msgspec import Struct
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from core.config import RoutingConfig
from core.errors import (
    AllTargetsFailedError,
    NoTargetAvailableError,
    ProviderError,
    UpstreamMalformedError,
    UpstreamRateLimitedError,
    UpstreamServerError,
    UpstreamTimeoutError,
)
from routers.targets import Skipped, Target

T = TypeVar("T")
P = TypeVar("P")
Sleep = Callable[[float], Awaitable[None]]


class Attempt(Struct, frozen=True):
    label: str
    error: str | None = None  # the error class name, None for success


class Trace:
    """What happened to one request on its way through the plan."""

    def __init__(self, skipped: Sequence[Skipped] = ()) -> None:
        self.attempts: list[Attempt] = []
        self.skipped = list(skipped)
        self.served_by: Target | None = None

    @property
    def fallbacks(self) -> int:
        """How many targets were given up on before the one that served (or the last one)."""
        labels = {attempt.label for attempt in self.attempts}
        return max(0, len(labels) - 1)

    def route_reason(self) -> str:
        """A short human reason, sent as ``x-switchyard-route-reason``."""
        if self.served_by is None:
            return "no target succeeded"
        failed = sorted(
            {a.label for a in self.attempts if a.error and a.label != self.served_by.label}
        )
        reason = "priority: first available target"
        if failed:
            reason = f"fallback after {', '.join(failed)} failed"
        if self.skipped:
            reason += "; skipped " + ", ".join(f"{s.label} ({s.reason})" for s in self.skipped)
        return reason


class Executor:
    """Runs calls against a plan with retries and fallback. ``sleep`` and ``jitter`` are
    injected so tests run without waiting."""

    def __init__(
        self,
        config: RoutingConfig,
        sleep: Sleep = asyncio.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._config = config
        self._sleep = sleep
        self._jitter = jitter

    def _should_retry(self, exc: BaseException) -> bool:
        if not isinstance(exc, ProviderError):
            return False
        if exc.retryable:
            return True
        short_wait = (
            exc.retry_after is not None and exc.retry_after <= self._config.max_retry_after_s
        )
        return short_wait and isinstance(exc, UpstreamRateLimitedError | UpstreamServerError)

    def _backoff(self, exc: BaseException | None, retries_before: int) -> float:
        """Seconds before the next try: the upstream's Retry-After when it sent one, else
        exponential backoff with jitter (``retries_before`` tries already repeated)."""
        if isinstance(exc, ProviderError) and exc.retry_after is not None:
            return float(exc.retry_after)
        base: float = self._config.retry_backoff_s * 2.0**retries_before
        return base * (0.5 + self._jitter())

    def _wait(self, state: RetryCallState) -> float:
        # attempt_number counts the retries after the plain first attempt.
        exc = state.outcome.exception() if state.outcome else None
        return self._backoff(exc, state.attempt_number)

    def _retrying(self, attempts: int) -> AsyncRetrying:
        return AsyncRetrying(
            stop=stop_after_attempt(attempts),
            retry=retry_if_exception(self._should_retry),
            wait=self._wait,
            sleep=self._sleep,
            reraise=True,
        )

    async def call(
        self,
        model: str,
        plan: Sequence[Target],
        call: Callable[[Target], Awaitable[T]],
        trace: Trace,
    ) -> T:
        """The first successful ``call(target)`` along ``plan``."""
        failures: list[ProviderError] = []
        for target in _non_empty(model, plan, trace):
            try:
                result = await self._call_target(target, call, trace)
            except ProviderError as exc:
                failures.append(exc)
                if not exc.fallback_ok:
                    raise
                continue
            trace.served_by = target
            return result
        raise AllTargetsFailedError(model, failures)

    async def _call_target(
        self, target: Target, call: Callable[[Target], Awaitable[T]], trace: Trace
    ) -> T:
        """One attempt at once; tenacity takes over only when it failed retryably, so the
        common path pays nothing for the retry machinery."""
        try:
            return await self._attempt(target, call, trace)
        except ProviderError as exc:
            if not self._should_retry(exc) or self._config.max_attempts_per_target < 2:
                raise
            await self._sleep(self._backoff(exc, 0))
        async for attempt in self._retrying(self._config.max_attempts_per_target - 1):
            with attempt:
                result = await self._attempt(target, call, trace)
        return result

    async def _attempt(
        self, target: Target, call: Callable[[Target], Awaitable[T]], trace: Trace
    ) -> T:
        try:
            async with asyncio.timeout(target.timeouts.total):
                result = await call(target)
        except TimeoutError as exc:
            error = _timeout(target, target.timeouts.total)
            trace.attempts.append(Attempt(target.label, type(error).__name__))
            raise error from exc
        except ProviderError as exc:
            exc.provider = exc.provider or target.provider_name
            trace.attempts.append(Attempt(target.label, type(exc).__name__))
            raise
        trace.attempts.append(Attempt(target.label))
        return result

    async def open_stream(
        self,
        model: str,
        plan: Sequence[Target],
        open_stream: Callable[[Target], AsyncIterator[P]],
        trace: Trace,
    ) -> tuple[P, AsyncIterator[P]]:
        """The first chunk and the rest of the first stream that yields one within its
        target's first-token deadline. After that chunk the stream is committed."""
        return await self.call(model, plan, lambda t: _first_and_rest(t, open_stream), trace)


async def _first_and_rest(
    target: Target, open_stream: Callable[[Target], AsyncIterator[P]]
) -> tuple[P, AsyncIterator[P]]:
    stream = open_stream(target)
    try:
        first = await _first_item(target, stream)
    except BaseException:
        await close_stream(stream)  # release the upstream connection before moving on
        raise
    return first, stream


def _non_empty(model: str, plan: Sequence[Target], trace: Trace) -> Sequence[Target]:
    if not plan:
        skipped = "; ".join(f"{s.label}: {s.reason}" for s in trace.skipped) or "none configured"
        raise NoTargetAvailableError(f"no target is available for model '{model}' ({skipped})")
    return plan


def _timeout(target: Target, seconds: float) -> UpstreamTimeoutError:
    return UpstreamTimeoutError(
        f"upstream {target.provider_name} did not answer within {seconds:g}s",
        provider=target.provider_name,
    )


async def _first_item(target: Target, stream: AsyncIterator[P]) -> P:
    try:
        async with asyncio.timeout(target.timeouts.first_token):
            return await anext(stream)
    except TimeoutError as exc:
        raise _timeout(target, target.timeouts.first_token) from exc
    except StopAsyncIteration as exc:
        raise UpstreamMalformedError(
            f"upstream {target.provider_name} ended the stream before its first chunk",
            provider=target.provider_name,
        ) from exc


async def close_stream(stream: AsyncIterator[Any]) -> None:
    """Close an async generator so its upstream connection is released."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()
