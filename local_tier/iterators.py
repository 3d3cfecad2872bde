"""Owning async iterators of an engine's outputs: close them however a consumer stops
(an answer abandoned by its client aborts its engine sequence now, not when it is
garbage-collected), and surface errors raised before the first output while a response
can still say so. Shared by the in-process provider, the HTTP worker and its metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeVar

T = TypeVar("T")


@asynccontextmanager
async def owned(items: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """Close ``items`` (when it can be closed) on the way out, however the block ends, so an
    abandoned answer aborts its engine sequence now rather than when it is collected."""
    try:
        yield items
    finally:
        await aclose(items)


async def aclose(items: AsyncIterator[T]) -> None:
    """Close an async iterator that can be closed (async generators can)."""
    close = getattr(items, "aclose", None)
    if close is not None:
        await close()


async def prepend(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    """``first`` then the items of ``rest`` (closed with this generator)."""
    async with owned(rest):
        yield first
        async for item in rest:
            yield item


async def started(items: AsyncIterator[T]) -> AsyncIterator[T]:
    """Wait for the first item, then return an iterator of all of them: errors raised before
    the first output (validation, overload) surface here, before a response starts. On any
    failure, including cancellation, ``items`` is closed."""
    try:
        first = await anext(items)
    except BaseException:
        await aclose(items)
        raise
    return prepend(first, items)
