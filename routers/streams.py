"""Stream commit: a target's stream is opened, its first item awaited within the
target's first-token timeout (or the shorter window a first-token deadline leaves), and
the rest handed back with an idle timeout on every next item (a hedge race may end the
first wait early, ``routers.hedge``). Whatever fails, the upstream
stream is closed before the error goes on, so its connection is released.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

from core.errors import AttemptDeadlineError, UpstreamMalformedError, UpstreamTimeoutError
from routers.hedge import CutSwitch
from routers.targets import Target

P = TypeVar("P")


async def first_and_rest(
    target: Target,
    open_stream: Callable[[Target], AsyncIterator[P]],
    cut_after: float | None,
    switch: CutSwitch | None = None,
) -> tuple[P, AsyncIterator[P]]:
    """Open ``target``'s stream and wait for its first item (``_first_item``); the rest
    comes back idle-guarded. On any failure the upstream stream is closed first. A hedge
    race may end the wait through ``switch`` (then ``AttemptDeadlineError``)."""
    stream = open_stream(target)
    try:
        first = await _first_item(target, stream, cut_after, switch)
    except BaseException:
        await close_stream(stream)  # release the upstream connection before moving on
        raise
    return first, _IdleGuarded(target, stream)


class _IdleGuarded(Generic[P]):
    """``stream`` with a deadline of ``timeouts.idle`` on every next chunk. ``aclose``
    closes the upstream stream even when iteration never started (a class rather than an
    async generator for that reason: closing an unstarted generator skips its cleanup)."""

    def __init__(self, target: Target, stream: AsyncIterator[P]) -> None:
        self._target = target
        self._stream = stream

    def __aiter__(self) -> _IdleGuarded[P]:
        return self

    async def __anext__(self) -> P:
        idle = self._target.timeouts.idle
        deadline = asyncio.timeout(idle)
        try:
            async with deadline:
                return await anext(self._stream)
        except TimeoutError as exc:
            if not deadline.expired():
                raise
            await self.aclose()
            name = self._target.provider_name
            raise UpstreamTimeoutError(
                f"upstream {name} sent nothing for {idle:g}s mid-stream", provider=name
            ) from exc

    async def aclose(self) -> None:
        await close_stream(self._stream)


def timeout_error(target: Target, seconds: float) -> UpstreamTimeoutError:
    return UpstreamTimeoutError(
        f"upstream {target.provider_name} did not answer within {seconds:g}s",
        provider=target.provider_name,
    )


async def _first_item(
    target: Target, stream: AsyncIterator[P], cut_after: float | None, switch: CutSwitch | None
) -> P:
    """The stream's first item within the target's first-token timeout, or within
    ``cut_after`` seconds when that is sooner, or until ``switch`` is pulled (both:
    ``AttemptDeadlineError``)."""
    limit = target.timeouts.first_token
    cut = cut_after is not None and cut_after < limit
    started = asyncio.get_running_loop().time()
    wait = asyncio.timeout(cut_after if cut else limit)
    try:
        async with wait:
            if switch is not None:
                switch.arm(wait)
            return await anext(stream)
    except TimeoutError as exc:
        if switch is not None and switch.pulled:
            waited = asyncio.get_running_loop().time() - started
            raise AttemptDeadlineError(
                f"upstream {target.provider_name} had not started answering after "
                f"{waited:.3g}s, when a hedged attempt did",
                provider=target.provider_name,
            ) from exc
        if cut:
            raise AttemptDeadlineError(
                f"upstream {target.provider_name} had not started answering after "
                f"{cut_after:.3g}s, when the request's latency objective needed it",
                provider=target.provider_name,
            ) from exc
        raise timeout_error(target, limit) from exc
    except StopAsyncIteration as exc:
        raise UpstreamMalformedError(
            f"upstream {target.provider_name} ended the stream before its first chunk",
            provider=target.provider_name,
        ) from exc
    finally:
        if switch is not None:
            switch.disarm()


async def close_stream(stream: AsyncIterator[Any]) -> None:
    """Close an async generator so its upstream connection is released."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()
