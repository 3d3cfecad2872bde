"""The in-memory ``Store``: one process, no I/O, expiry on the injected clock.

Scripts run their Python twin directly on the dict. That is atomic with respect to every
other coroutine because it never awaits; it is NOT thread-safe (one event loop per store).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.clock import Clock, SystemClock
from policies.store.base import Script, Value


def _as_bytes(key: str, value: Any) -> bytes:
    """What ``GET`` would return for a value: strings and numbers as bytes (as Redis
    stores them); anything else is a structure a script keeps, like a Redis hash."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, int | float):
        return repr(value).encode()
    raise TypeError(f"{key!r} holds a {type(value).__name__}, not a string value")


class DictData:
    """Key -> value with optional expiry times (wall-clock seconds of ``clock``): what
    Script twins receive as ``base.MemoryData`` (plus ``ttl``, ``persist``, ``sweep``).

    Expiry is lazy: an expired key is dropped when it is next touched, or by ``sweep``.
    ``set`` keeps a key's TTL (like INCRBY/HSET on Redis, which is what script twins
    mirror); ``expire`` sets it; ``expire`` with ``ttl_s <= 0`` deletes the key, as Redis does.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._values: dict[str, Any] = {}
        self._expires: dict[str, float] = {}

    def _live(self, key: str) -> bool:
        deadline = self._expires.get(key)
        if deadline is not None and deadline <= self._clock.wall():
            self.delete(key)
        return key in self._values

    def get(self, key: str) -> Any:
        return self._values[key] if self._live(key) else None

    def set(self, key: str, value: Any) -> None:
        self._live(key)  # an expired key's old TTL must not carry over to the new value
        self._values[key] = value

    def delete(self, key: str) -> None:
        self._values.pop(key, None)
        self._expires.pop(key, None)

    def expire(self, key: str, ttl_s: float) -> None:
        if not self._live(key):
            return
        if ttl_s <= 0:
            self.delete(key)
        else:
            self._expires[key] = self._clock.wall() + ttl_s

    def persist(self, key: str) -> None:
        """Drop a key's TTL (what a plain ``SET`` without expiry does)."""
        self._expires.pop(key, None)

    def ttl(self, key: str) -> float | None:
        """Seconds left, or None when the key is missing or never expires."""
        if not self._live(key) or key not in self._expires:
            return None
        return self._expires[key] - self._clock.wall()

    def sweep(self) -> int:
        """Drop every expired key now; returns how many were dropped."""
        now = self._clock.wall()
        dead = [k for k, deadline in self._expires.items() if deadline <= now]
        for key in dead:
            self.delete(key)
        return len(dead)

    def __len__(self) -> int:
        self.sweep()
        return len(self._values)


class MemoryStore:
    """``Store`` for a single process. ``now()`` is ``clock.wall()``; scripts get it as
    their ``now`` argument. Never raises ``StoreUnavailableError``.

    Memory is bounded only by the TTLs callers set: keys without a TTL live until deleted,
    and expired keys are swept every ``sweep_every`` writes so untouched keys do not pile up.
    """

    name = "memory"

    def __init__(self, clock: Clock | None = None, sweep_every: int = 10_000) -> None:
        self.clock: Clock = clock or SystemClock()
        self.data = DictData(self.clock)
        self._sweep_every = sweep_every
        self._writes = 0

    def now(self) -> float:
        return self.clock.wall()

    def _wrote(self) -> None:
        self._writes += 1
        if self._writes >= self._sweep_every:
            self._writes = 0
            self.data.sweep()

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Value]) -> Any:
        self._wrote()
        return script.python(self.data, keys, args, self.now())

    async def get(self, key: str) -> bytes | None:
        value = self.data.get(key)
        return None if value is None else _as_bytes(key, value)

    async def set(self, key: str, value: bytes, ttl_s: float | None = None) -> None:
        self._wrote()
        self.data.set(key, value)
        self.data.persist(key)
        if ttl_s is not None:
            self.data.expire(key, ttl_s)

    async def delete(self, key: str) -> None:
        self.data.delete(key)

    async def aclose(self) -> None:
        """Nothing to release; the data stays readable (tests inspect it after close)."""
