"""The Redis ``Store``: state shared by any number of gateway replicas.

Contract:
- every key is prefixed with ``config.key_prefix`` (``key(name)``); Lua scripts receive the
  prefixed keys in ``KEYS`` and must not build key names of their own;
- scripts run with EVALSHA; the SHA1 is computed locally, and on NOSCRIPT (first use, or a
  restarted/flushed Redis) the body is loaded once and the call repeated;
- the time a script sees is whatever the caller puts in ``ARGV`` (callers pass
  ``store.now()``, the injected clock's wall time); Redis' own clock is never used;
- a refused connection, a reset, or a command slower than ``config.timeout_s`` raises
  ``StoreUnavailableError``. After such a failure every call fails fast (no network I/O)
  until ``config.retry_interval_s`` has passed on the clock's monotonic time; the next call
  then tries Redis again, so recovery needs no manual step.
- errors that are not about reachability (a Lua error, a wrong type) propagate unchanged:
  they are bugs, not outages.

``client`` (``redis.asyncio.Redis``) and ``key(name)`` are public for users that need raw
commands (the usage ledger's stream). Such users should wrap their calls in ``guard()`` so
outages are reported and fail fast the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core.clock import Clock, SystemClock
from core.config import ConfigError
from core.config_tenants import RedisConfig
from policies.store.base import Script, StoreUnavailableError, Value

# What counts as "Redis is unreachable". BusyLoadingError (a restarting Redis loading its
# data) is a ConnectionError subclass, so it is covered too; READONLY means we reached a
# replica during a failover: no writes are possible there either.
_OUTAGES = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, OSError, asyncio.TimeoutError)


_MAX_CONNECTIONS = 256


def redis_url(config: RedisConfig, env: Mapping[str, str]) -> str:
    """The URL to connect to: ``url_env``'s value when set, else ``url``."""
    if config.url_env is None:
        return config.url
    url = env.get(config.url_env)
    if not url:
        raise ConfigError(
            [f"state.redis.url_env: environment variable {config.url_env} is not set"]
        )
    return url


class RedisStore:
    """``Store`` on Redis via ``redis.asyncio`` (see the module docstring for the contract)."""

    name = "redis"

    def __init__(
        self, config: RedisConfig, clock: Clock | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        """``env`` (default: the process environment) holds ``config.url_env``'s URL;
        ``ConfigError`` naming the variable when it is set in the config but not there."""
        self.config = config
        self.clock: Clock = clock or SystemClock()
        # A blocking pool: a burst beyond max_connections waits (up to timeout_s) for a
        # free connection instead of raising MaxConnectionsError, which would read as an
        # outage and send every caller to its fallback.
        pool = aioredis.BlockingConnectionPool.from_url(
            redis_url(config, os.environ if env is None else env),
            max_connections=_MAX_CONNECTIONS,
            timeout=config.timeout_s,
            socket_timeout=config.timeout_s,
            socket_connect_timeout=config.timeout_s,
            # One immediate retry on a connection error only: after a Redis restart the
            # pool still holds dead sockets, and the first command on one fails although
            # Redis is back. Timeouts (connect or read) are not retried, so a failing call
            # costs about timeout_s (a refused connect is retried once, which is instant).
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            decode_responses=False,
        )
        self.client: aioredis.Redis = aioredis.Redis(connection_pool=pool)
        self._shas: dict[str, str] = {}  # lua body -> sha1
        self._down_until: float | None = None  # clock.now() before which we fail fast
        self.failures = 0  # outages seen (not counting fail-fast refusals)

    def key(self, name: str) -> str:
        return self.config.key_prefix + name

    def now(self) -> float:
        return self.clock.wall()

    @property
    def available(self) -> bool:
        """False while failing fast after an outage."""
        return self._down_until is None or self.clock.now() >= self._down_until

    @contextlib.asynccontextmanager
    async def guard(self) -> AsyncIterator[None]:
        """Run raw client calls under the outage rules: fail fast while down, and turn
        connection errors and timeouts into ``StoreUnavailableError``."""
        if not self.available:
            raise StoreUnavailableError("redis unavailable (retrying later)")
        try:
            yield
        except _OUTAGES as exc:
            self.failures += 1
            self._down_until = self.clock.now() + self.config.retry_interval_s
            raise StoreUnavailableError(f"redis unavailable: {exc}") from exc
        self._down_until = None

    def _sha(self, lua: str) -> str:
        sha = self._shas.get(lua)
        if sha is None:
            sha = self._shas[lua] = hashlib.sha1(lua.encode()).hexdigest()
        return sha

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Value]) -> Any:
        full = [self.key(k) for k in keys]
        sha = self._sha(script.lua)
        async with self.guard():
            try:
                return await self.client.evalsha(sha, len(full), *full, *args)
            except NoScriptError:
                loaded = await self.client.script_load(script.lua)
                return await self.client.evalsha(loaded, len(full), *full, *args)

    async def get(self, key: str) -> bytes | None:
        async with self.guard():
            value = await self.client.get(self.key(key))
        if isinstance(value, str):  # only with decode_responses, which we never set
            return value.encode()
        return value

    async def set(self, key: str, value: bytes, ttl_s: float | None = None) -> None:
        px = None if ttl_s is None else max(1, round(ttl_s * 1000))
        async with self.guard():
            await self.client.set(self.key(key), value, px=px)

    async def delete(self, key: str) -> None:
        async with self.guard():
            await self.client.delete(self.key(key))

    async def aclose(self) -> None:
        with contextlib.suppress(*_OUTAGES):
            await self.client.aclose(close_connection_pool=True)
