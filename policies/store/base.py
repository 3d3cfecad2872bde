"""The one state interface every policy uses, with two backends: in-memory (one process)
and Redis (any number of replicas).

Atomic operations are ``Script``s: a Lua body that Redis runs atomically (EVALSHA) and a
Python function with the same meaning that the memory backend runs (atomic because it never
awaits). Policies define their scripts next to their logic; tests run both backends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

Value = bytes | str | int | float


class StoreUnavailableError(Exception):
    """The backend could not be reached in time. Policies decide what that means
    (fail open with local limits, or fail closed with 503)."""


class Script:
    """One atomic operation. ``python(data, keys, args, now)`` mutates ``data`` (the memory
    backend's dict of key -> value; expiry is handled by the backend through
    ``MemoryData.expire``) and returns what the Lua script returns: ints, bytes/str, or
    (nested) lists of those. ``now`` is the store's clock in seconds; Lua scripts get the
    time as an argument from the caller, never from Redis' clock, so both agree."""

    def __init__(
        self,
        name: str,
        lua: str,
        python: Callable[[MemoryData, Sequence[str], Sequence[Value], float], Any],
    ) -> None:
        self.name = name
        self.lua = lua
        self.python = python


class MemoryData(Protocol):
    """What a Script's Python body sees of the memory backend."""

    def get(self, key: str) -> Any: ...

    def set(self, key: str, value: Any) -> None: ...

    def delete(self, key: str) -> None: ...

    def expire(self, key: str, ttl_s: float) -> None: ...


class Store(Protocol):
    """Shared state. Keys are given without the backend's prefix. Every method may raise
    ``StoreUnavailableError``."""

    name: str  # "memory" or "redis"

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Value]) -> Any: ...

    async def get(self, key: str) -> bytes | None: ...

    async def set(self, key: str, value: bytes, ttl_s: float | None = None) -> None: ...

    async def delete(self, key: str) -> None: ...

    def now(self) -> float:
        """The clock scripts receive (wall-clock seconds; injected in tests)."""
        ...

    async def aclose(self) -> None: ...
