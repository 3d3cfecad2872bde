"""The exact response cache at the edge of a chat request: look up before routing, replay
a hit (as JSON or as a stream), store a deterministic answer after it was served."""

from __future__ import annotations

from core.wire import ChatChunk, ChatRequest, ChatResponse
from gateway.request.scope import Scope
from policies.response_cache import StreamAccumulator

CACHE_HEADER = "x-switchyard-cache"


class Collector:
    """Folds streamed chunks into one response when the stream may be cached."""

    def __init__(self, enabled: bool) -> None:
        self._acc = StreamAccumulator() if enabled else None

    def add(self, chunk: ChatChunk) -> None:
        if self._acc is not None:
            self._acc.add(chunk)

    def result(self) -> ChatResponse | None:
        acc = self._acc
        return acc.result() if acc is not None and acc.finished else None  # never a cut stream


class CacheUse:
    """What the response cache may do for one request (decided once, from the request,
    the client's Cache-Control and the alias's version)."""

    def __init__(self, scope: Scope, req: ChatRequest, raw: bytes) -> None:
        self._scope = scope
        cache = scope.state.responses
        self._cache = cache
        self.key: str | None = None
        self.read = False
        if cache.enabled and cache.cacheable(req, scope.headers):
            tenant = scope.record.principal.tenant or ""
            version = scope.runtime.versions[req.model]
            self.key = cache.key(tenant, version, raw)
            self.read = cache.may_read(scope.headers)

    async def lookup(self) -> ChatResponse | None:
        if self.key is None or not self.read:
            return None
        entry = await self._cache.get(self.key)
        hit = entry.response if entry is not None else None
        record = self._scope.record
        record.extra_headers[CACHE_HEADER] = "hit" if hit is not None else "miss"
        return hit

    def store(self, response: ChatResponse | None) -> None:
        if self.key is not None and response is not None:
            self._scope.state.spawn(self._cache.put(self.key, response))

    def collector(self) -> Collector:
        return Collector(self.key is not None)

    def store_collected(self, collected: Collector) -> None:
        self.store(collected.result())
