"""The executor walks a plan: each target with retries under tenacity (transient errors
of that target only, within the retry budget), then the next target on errors whose class
says ``fallback_ok``; a client error (400) never fans out. Streams fall back only until their
first chunk has arrived; after it, a gap longer than the target's idle timeout ends the
stream with ``UpstreamTimeoutError`` (``routers.streams``). A stream whose first target has
a hedge (``Deadline.hedge``) races it against the second (``routers.hedge``).

Around every attempt an optional ``AttemptObserver`` hears about it (breakers, latency
stats); before every target (and every retry) an optional ``gate`` may refuse it (an open
breaker, a half-open breaker with no probe slot left).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, stop_after_attempt

from core.clock import Clock, SystemClock
from core.config import RoutingConfig
from core.errors import (
    AllTargetsFailedError,
    AttemptDeadlineError,
    NoTargetAvailableError,
    ProviderError,
    UpstreamRateLimitedError,
    UpstreamServerError,
)
from core.routing import AttemptObserver
from routers.hedge import CutSwitch, HedgeRun, cut_error, hedge_budget, provider_errors, race
from routers.retry_budget import RetryBudget
from routers.strategies.deadlines import Deadline
from routers.streams import close_stream, first_and_rest, timeout_error
from routers.targets import Skipped, Target
from routers.trace import Attempt, Trace

T = TypeVar("T")
P = TypeVar("P")
Sleep = Callable[[float], Awaitable[None]]
# A target whose first-token deadline leaves less than this is skipped ("deadline passed"):
# an attempt that short would only cost the upstream a prompt it bills for.
MIN_ATTEMPT_WINDOW_S = 0.05
# True admits the target; False skips it as "circuit open"; a string skips it with that
# string as the reason (e.g. "probe limit").
Gate = Callable[[Target], Awaitable[bool | str]]


class _Hooks:
    """The observer and gate in force for one ``Executor.call``."""

    __slots__ = ("gate", "observer")

    def __init__(self, observer: AttemptObserver | None, gate: Gate | None) -> None:
        self.observer = observer
        self.gate = gate


class Executor:
    """Runs calls against a plan with retries and fallback. ``sleep``, ``jitter`` and
    ``clock`` are injected so tests run without waiting. ``retry_budget`` defaults to one
    built from ``config.retry_budget`` on ``clock``."""

    def __init__(
        self,
        config: RoutingConfig,
        sleep: Sleep = asyncio.sleep,
        jitter: Callable[[], float] = random.random,
        *,
        observer: AttemptObserver | None = None,
        gate: Gate | None = None,
        retry_budget: RetryBudget | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._config = config
        self._sleep = sleep
        self._jitter = jitter
        self._observer = observer
        self._gate = gate
        self._clock: Clock = clock or SystemClock()
        self._budget = retry_budget or RetryBudget(config.retry_budget, self._clock)
        self.hedges = hedge_budget(self._clock)

    def _should_retry(self, exc: BaseException) -> bool:
        """Whether to try the same target again. An upstream that asked for a longer wait
        than ``max_retry_after_s`` is never waited on (whatever the error), nor is a
        Retry-After that is not a number (NaN compares false)."""
        if not isinstance(exc, ProviderError):
            return False
        if exc.retry_after is not None:
            if not exc.retry_after <= self._config.max_retry_after_s:
                return False
            if isinstance(exc, UpstreamRateLimitedError | UpstreamServerError):
                return True
        return exc.retryable

    def _backoff(self, exc: BaseException | None, retries_before: int) -> float:
        """Seconds before the next try: the upstream's Retry-After when it sent one (never
        more than ``max_retry_after_s``), else exponential backoff with jitter
        (``retries_before`` tries already repeated)."""
        if isinstance(exc, ProviderError) and exc.retry_after is not None:
            return min(float(exc.retry_after), self._config.max_retry_after_s)
        base: float = self._config.retry_backoff_s * 2.0**retries_before
        return base * (0.5 + self._jitter())

    def _all_failed(self, model: str, failures: list[ProviderError]) -> AllTargetsFailedError:
        """The error for a plan whose every called target failed. The Retry-After it tells
        the client is capped at ``max_client_retry_after_s``: an upstream's "come back in
        11 days" must not become the gateway's answer (other targets, or the same one after
        its window, may serve much sooner)."""
        error = AllTargetsFailedError(model, failures)
        if error.retry_after is not None:
            error.retry_after = min(error.retry_after, self._config.max_client_retry_after_s)
        return error

    @staticmethod
    async def _refusal(target: Target, gate: Gate | None) -> str | None:
        """Why ``gate`` refuses ``target`` now, or None when it may be called."""
        if gate is None:
            return None
        verdict = await gate(target)
        if verdict is True:
            return None
        return verdict or "circuit open"

    async def call(
        self,
        model: str,
        plan: Sequence[Target],
        call: Callable[[Target], Awaitable[T]],
        trace: Trace,
        *,
        observer: AttemptObserver | None = None,
        gate: Gate | None = None,
        skip: Callable[[Target], str | None] | None = None,
        failures: list[ProviderError] | None = None,
    ) -> T:
        """The first successful ``call(target)`` along ``plan``. Raises the first error
        that may not fall back, ``AllTargetsFailedError`` when every called target failed,
        ``NoTargetAvailableError`` when the plan is empty or the gate refused every target.
        ``observer`` and ``gate`` apply to this call (per-request observers), in place of
        the executor's own; ``skip`` may pass over a target with a reason before the gate
        is asked (a first-token deadline already gone). ``failures``: those of targets
        already tried for this request (a hedge race), reported with the rest."""
        hooks = _Hooks(observer or self._observer, gate or self._gate)
        failures = list(failures or [])
        for target in plan if failures else _non_empty(model, plan, trace):
            refusal = (skip(target) if skip else None) or await self._refusal(target, hooks.gate)
            if refusal is not None:
                trace.skipped.append(Skipped(target.label, refusal))
                continue
            try:
                result = await self._call_target(target, call, trace, hooks)
            except ProviderError as exc:
                failures.append(exc)
                if not exc.fallback_ok:
                    raise
                continue
            trace.served_by = target
            return result
        if not failures:
            raise _unavailable(model, trace)
        raise self._all_failed(model, failures)

    async def _call_target(
        self, target: Target, call: Callable[[Target], Awaitable[T]], trace: Trace, hooks: _Hooks
    ) -> T:
        """Attempts at one target. The first runs at once (the common path pays nothing for
        the retry machinery); tenacity runs the retries, each after a backoff and only while
        the error is transient, attempts are left, the retry budget has one and the gate
        still admits the target (a breaker that just opened stops the retries)."""
        self._budget.record_call(target.label)
        try:
            return await self._attempt(target, call, trace, hooks.observer)
        except ProviderError as exc:
            if not await self._may_retry(exc, target, 0, hooks.gate):
                raise
            await self._sleep(self._backoff(exc, 0))

        async def should_retry(state: RetryCallState) -> bool:
            # attempt_number counts tenacity's attempts, i.e. retries after the first one.
            exc = state.outcome.exception() if state.outcome else None
            if not isinstance(exc, ProviderError):
                return False
            return await self._may_retry(exc, target, state.attempt_number, hooks.gate)

        retrying = AsyncRetrying(
            stop=stop_after_attempt(max(1, self._config.max_attempts_per_target - 1)),
            retry=should_retry,
            wait=self._wait,
            sleep=self._sleep,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                result = await self._attempt(target, call, trace, hooks.observer)
        return result

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        return self._backoff(exc, state.attempt_number)

    async def _may_retry(
        self, exc: ProviderError, target: Target, retries: int, gate: Gate | None
    ) -> bool:
        if not self._should_retry(exc) or retries + 1 >= self._config.max_attempts_per_target:
            return False
        if not self._budget.try_retry(target.label):
            return False
        return await self._refusal(target, gate) is None

    async def _attempt(
        self,
        target: Target,
        call: Callable[[Target], Awaitable[T]],
        trace: Trace,
        observer: AttemptObserver | None,
    ) -> T:
        if observer is not None:
            observer.attempt_started(target.label)
        started = self._clock.now()
        failure: BaseException | None = None
        try:
            result = await _within_total(target, call)
        except BaseException as exc:
            failure = exc
            if isinstance(exc, ProviderError):
                exc.provider = exc.provider or target.provider_name
                ended = self._clock.now()
                trace.attempts.append(Attempt(target.label, type(exc).__name__, started, ended))
            raise
        finally:
            if observer is not None:
                _tell(observer, target.label, failure, self._clock.now() - started)
        trace.attempts.append(Attempt(target.label, None, started, self._clock.now()))
        return result

    async def open_stream(
        self,
        model: str,
        plan: Sequence[Target],
        open_stream: Callable[[Target], AsyncIterator[P]],
        trace: Trace,
        *,
        observer: AttemptObserver | None = None,
        gate: Gate | None = None,
        deadlines: Mapping[str, Deadline] | None = None,
        elapsed_s: float = 0.0,
    ) -> tuple[P, AsyncIterator[P]]:
        """The first chunk and the rest of the first stream that yields one within its
        target's first-token deadline. After that chunk the stream is committed; the rest
        ends with ``UpstreamTimeoutError`` when a chunk takes longer than
        ``timeouts.idle``. Closing the returned iterator closes the upstream stream.

        ``deadlines`` (by target label; ``routers.strategies.deadlines``, counted from the
        request's start, ``elapsed_s`` ago) cut a target's attempts short of its own
        first-token timeout: past it, the attempt ends with ``AttemptDeadlineError`` and
        the plan moves on; a target whose window is already gone is skipped."""
        begun = self._clock.now() - elapsed_s

        def window_s(target: Target) -> float | None:
            deadline = (deadlines or {}).get(target.label)
            return None if deadline is None else deadline.window_s(self._clock.now() - begun)

        def passed(target: Target) -> str | None:
            left = window_s(target)
            return "deadline passed" if left is not None and left < MIN_ATTEMPT_WINDOW_S else None

        def commit(target: Target) -> Awaitable[tuple[P, AsyncIterator[P]]]:
            return first_and_rest(target, open_stream, window_s(target))

        first = (deadlines or {}).get(plan[0].label) if plan else None
        if first is not None and first.hedge is not None and len(plan) >= 2:
            hooks = _Hooks(observer or self._observer, gate or self._gate)
            hedge = HedgeRun(model, plan, open_stream, commit, passed)
            return await self._hedged(hedge, first, self._clock.now() - begun, trace, hooks)
        return await self.call(
            model, plan, commit, trace, observer=observer, gate=gate, skip=passed
        )

    async def _hedged(
        self,
        run: HedgeRun[P],
        deadline: Deadline,
        elapsed_s: float,
        trace: Trace,
        hooks: _Hooks,
    ) -> tuple[P, AsyncIterator[P]]:
        """``open_stream`` when the plan's first target may be hedged (``routers.hedge``):
        the first two targets race, then the rest of the plan is walked as usual."""
        primary, backup = run.plan[0], run.plan[1]
        refusal = run.passed(primary) or await self._refusal(primary, hooks.gate)
        if refusal is not None:
            trace.skipped.append(Skipped(primary.label, refusal))
            return await self._walk_rest(run, run.plan[1:], [], trace, hooks)
        self.hedges.record_call(run.model)
        switch = CutSwitch()
        share = deadline.hedge.max_share if deadline.hedge is not None else 0.0

        def primary_commit(target: Target) -> Awaitable[tuple[P, AsyncIterator[P]]]:
            return first_and_rest(target, run.open_stream, None, switch)

        async def may_hedge() -> bool:
            if run.passed(backup) or await self._refusal(backup, hooks.gate) is not None:
                return False
            return share is None or self.hedges.try_retry(run.model, share)

        outcome = await race(
            lambda: self._call_target(primary, primary_commit, trace, hooks),
            lambda: self._call_target(backup, run.commit, trace, hooks),
            hedge_after_s=deadline.hedge_window_s(elapsed_s) or 0.0,
            cut_after_s=deadline.window_s(elapsed_s),
            keep_cut=len(run.plan) > 2,
            may_hedge=may_hedge,
            switch=switch,
            cut_error=lambda: cut_error(primary),
            discard=lambda value: close_stream(value[1]),
        )
        if outcome.hedged:
            trace.hedge = (primary, backup)
        if outcome.winner is not None and outcome.value is not None:
            trace.served_by = run.plan[outcome.winner]
            return outcome.value
        failures = provider_errors(outcome.errors)
        rest = run.plan[2:] if outcome.hedged else run.plan[1:]
        return await self._walk_rest(run, rest, failures, trace, hooks)

    async def _walk_rest(
        self,
        run: HedgeRun[P],
        rest: Sequence[Target],
        failures: list[ProviderError],
        trace: Trace,
        hooks: _Hooks,
    ) -> tuple[P, AsyncIterator[P]]:
        """The plan after a hedge race (or a refused first target), unhedged."""
        return await self.call(
            run.model,
            rest,
            run.commit,
            trace,
            observer=hooks.observer,
            gate=hooks.gate,
            skip=run.passed,
            failures=failures,
        )


def _tell(
    observer: AttemptObserver, label: str, failure: BaseException | None, took: float
) -> None:
    """Report one finished attempt. A cancelled attempt reports ``CancelledError``, which
    observers treat as saying nothing about the target; one cut at its deadline reports
    how long it waited (a lower bound of its TTFT)."""
    if failure is None:
        observer.attempt_finished(label, error=None, ttft_s=took, retryable=False)
        return
    retryable = isinstance(failure, ProviderError) and failure.retryable
    waited = took if isinstance(failure, AttemptDeadlineError) else None
    observer.attempt_finished(
        label, error=type(failure).__name__, ttft_s=waited, retryable=retryable
    )


async def _within_total(target: Target, call: Callable[[Target], Awaitable[T]]) -> T:
    try:
        async with asyncio.timeout(target.timeouts.total):
            return await call(target)
    except TimeoutError as exc:
        raise timeout_error(target, target.timeouts.total) from exc


def _non_empty(model: str, plan: Sequence[Target], trace: Trace) -> Sequence[Target]:
    if not plan:
        raise _unavailable(model, trace)
    return plan


def _unavailable(model: str, trace: Trace) -> NoTargetAvailableError:
    skipped = "; ".join(f"{s.label}: {s.reason}" for s in trace.skipped) or "none configured"
    return NoTargetAvailableError(f"no target is available for model '{model}' ({skipped})")
