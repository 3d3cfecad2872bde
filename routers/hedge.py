"""Hedged first tokens: when a request's first target has not started answering by its
hedge moment, the next target is started alongside it, and whichever answers first serves.

Cutting a late target (``routers.strategies.deadlines``) throws away an answer that may be
about to come; hedging keeps it in the race. It costs what the loser was billed (its
prompt, for a managed API), so hedges are capped per model alias (at most
a configured share of the alias's recent hedgeable requests, plus one per window,
``hedge_budget``) and
only the first target of a plan hedges.

``race`` is the mechanism, free of the executor's bookkeeping: the two attempts are given
as callables (each does its own retries, observers and trace), and the loser is stopped:
a primary that lost is cut through its ``CutSwitch`` (it ends with
``AttemptDeadlineError``, a censored TTFT sample for the latency statistics, as a deadline
cut is); a backup that lost is cancelled (it says nothing about its target).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from core.clock import Clock
from core.config_routing import RetryBudgetConfig
from core.errors import AttemptDeadlineError, ProviderError
from routers.retry_budget import RetryBudget
from routers.targets import Target

T = TypeVar("T")
P = TypeVar("P")
HEDGE_WINDOW_S = 30.0  # the budget's memory
HEDGE_FLOOR = 1.0  # hedges a window always allows, so a quiet alias can hedge at all


def hedge_budget(clock: Clock) -> RetryBudget:
    """The hedge cap, a ``RetryBudget`` keyed by model alias: ``record_call(alias)`` for
    each request that could hedge, ``try_retry(alias, share)`` for each hedge; at most
    ``share`` of those requests over ``HEDGE_WINDOW_S``, plus ``HEDGE_FLOOR`` per window
    so a quiet alias can hedge at all."""
    floor = RetryBudgetConfig(
        ratio=0.0, min_per_s=HEDGE_FLOOR / HEDGE_WINDOW_S, window_s=HEDGE_WINDOW_S
    )
    return RetryBudget(floor, clock)


class CutSwitch:
    """Lets the race end an attempt that waits for its first item, as its deadline would:
    the attempt's wait registers its ``asyncio.Timeout`` (``arm``); ``pull`` moves it to
    now. ``pulled`` tells the attempt why its timeout expired."""

    def __init__(self) -> None:
        self._timeout: asyncio.Timeout | None = None
        self.pulled = False

    def arm(self, timeout: asyncio.Timeout) -> None:
        self._timeout = timeout
        if self.pulled:  # pulled between two tries of the target: this one ends at once
            timeout.reschedule(asyncio.get_running_loop().time())

    def disarm(self) -> None:
        self._timeout = None

    def pull(self) -> bool:
        """End the waiting attempt now; False when none is waiting (the caller cancels)."""
        self.pulled = True
        if self._timeout is None:
            return False
        self._timeout.reschedule(asyncio.get_running_loop().time())
        return True


class RaceResult(Generic[T]):
    """How a race ended: ``winner`` 0 (primary) or 1 (backup) with its ``value``, or None
    with the errors the attempts ended with (in the order they ended). ``hedged``: the
    backup was started."""

    def __init__(self) -> None:
        self.winner: int | None = None
        self.value: T | None = None
        self.errors: list[BaseException] = []
        self.hedged = False


async def race(
    primary: Callable[[], Awaitable[T]],
    backup: Callable[[], Awaitable[T]],
    *,
    hedge_after_s: float,
    cut_after_s: float | None,
    may_hedge: Callable[[], Awaitable[bool]],
    switch: CutSwitch,
    cut_error: Callable[[], BaseException],
    discard: Callable[[T], Awaitable[None]],
    keep_cut: bool = False,
) -> RaceResult[T]:
    """Run ``primary``; if it has not finished ``hedge_after_s`` after its start and
    ``may_hedge()`` agrees, run ``backup`` alongside and keep the first that succeeds (the
    other is stopped, see the module docstring). Without a hedge the primary is cut at
    ``cut_after_s`` (None: never), as an unhedged attempt would be; hedged, it keeps that
    cut once the backup has failed when ``keep_cut`` (the plan has a target after the
    backup: a race in place of a cut whose rescue failed then moves on as the cut would
    have, not after the primary's own first-token timeout; with none, a late answer is
    better than none). A primary error that may not fall back ends the race at once.
    ``cut_error()`` stands for a primary stopped outside its first-item wait (it was
    cancelled instead); ``discard(value)`` releases a success that came too late (both
    answered at once). Cancelling the race cancels both attempts and waits for them."""
    result: RaceResult[T] = RaceResult()
    started = asyncio.get_running_loop().time()
    first = asyncio.ensure_future(primary())
    second: asyncio.Future[T] | None = None
    try:
        await asyncio.wait({first}, timeout=hedge_after_s)
        if not first.done() and await may_hedge() and not first.done():
            result.hedged = True
            second = asyncio.ensure_future(backup())
            cut_at = None if cut_after_s is None or not keep_cut else started + cut_after_s
            await _first_success((first, second), switch, result, cut_error, discard, cut_at)
            return result
        if not first.done():
            wait_s = None if cut_after_s is None else max(0.0, cut_after_s - hedge_after_s)
            await asyncio.wait({first}, timeout=wait_s)
            if not first.done():
                await _stop(first, switch, cut_error, result, discard)
                return result
        _settle(first, 0, result)
        return result
    except BaseException:
        if result.winner is not None and result.value is not None:
            await discard(result.value)  # cancelled after a winner was found: release it
        raise
    finally:
        for task in (first, second):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


async def _first_success(
    tasks: tuple[asyncio.Future[T], asyncio.Future[T]],
    switch: CutSwitch,
    result: RaceResult[T],
    cut_error: Callable[[], BaseException],
    discard: Callable[[T], Awaitable[None]],
    cut_at: float | None,
) -> None:
    """Wait until one attempt succeeds (stop the other) or both have failed; once the
    backup has failed, the primary is stopped at ``cut_at`` (loop time; None: never)."""
    first, second = tasks
    pending = {first, second}
    loop = asyncio.get_running_loop()
    while pending and result.winner is None:
        timeout = None
        if second.done() and cut_at is not None:
            timeout = max(0.0, cut_at - loop.time())
        done, pending = await asyncio.wait(
            pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if not done:
            break  # the primary reached its cut with the backup failed: stopped below
        for index, task in enumerate(tasks):  # the primary first when both ended together
            if task not in done:
                continue
            if result.winner is None:
                _settle(task, index, result)
            elif not task.cancelled() and task.exception() is None:
                await discard(task.result())
        if result.winner is None and _must_not_fall_back(result):
            break
    for task in pending:
        if task is first:
            await _stop(first, switch, cut_error, result, discard)
        else:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if not task.cancelled() and task.exception() is None:
                await discard(task.result())  # it succeeded as it was being cancelled


def _settle(task: asyncio.Future[T], index: int, result: RaceResult[T]) -> None:
    """Record a finished attempt: its value as the winner, or its error."""
    if task.cancelled():
        return
    error = task.exception()
    if error is None:
        result.winner, result.value = index, task.result()
    elif error not in result.errors:
        result.errors.append(error)


def _must_not_fall_back(result: RaceResult[T]) -> bool:
    return any(not getattr(error, "fallback_ok", False) for error in result.errors)


async def _stop(
    task: asyncio.Future[T],
    switch: CutSwitch,
    cut_error: Callable[[], BaseException],
    result: RaceResult[T],
    discard: Callable[[T], Awaitable[None]],
) -> None:
    """End the primary as a deadline would: through its switch when it is waiting for its
    first item (it then fails with its own ``AttemptDeadlineError``), else by cancelling it
    (recorded as ``cut_error()``). A primary that succeeded meanwhile wins when nothing
    has; otherwise its answer is discarded."""
    if not switch.pull():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        result.errors.append(cut_error())
    elif result.winner is not None and task.exception() is None:
        await discard(task.result())
    else:
        _settle(task, 0, result)


class HedgeRun(Generic[P]):
    """What a hedged ``open_stream`` passes along: the alias, its plan, how to open and
    commit a target's stream, and the "deadline passed" skip."""

    def __init__(
        self,
        model: str,
        plan: Sequence[Target],
        open_stream: Callable[[Target], AsyncIterator[P]],
        commit: Callable[[Target], Awaitable[tuple[P, AsyncIterator[P]]]],
        passed: Callable[[Target], str | None],
    ) -> None:
        self.model = model
        self.plan = plan
        self.open_stream = open_stream
        self.commit = commit
        self.passed = passed


def cut_error(target: Target) -> AttemptDeadlineError:
    return AttemptDeadlineError(
        f"upstream {target.provider_name} was stopped for a hedged attempt",
        provider=target.provider_name,
    )


def provider_errors(errors: Sequence[BaseException]) -> list[ProviderError]:
    """The race's errors as the walk's failures: an error that is not a provider's (a bug)
    or that may not fall back (a client error) is raised at once."""
    for error in errors:
        if not isinstance(error, ProviderError) or not error.fallback_ok:
            raise error
    return [error for error in errors if isinstance(error, ProviderError)]
