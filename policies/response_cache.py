"""Exact-repeat response cache for deterministic chat requests, scoped per tenant.

Contract:
- Only deterministic requests are cached: ``temperature == 0`` or a ``seed``, and ``n``
  absent or 1. A client's ``Cache-Control: no-store`` means neither read nor write;
  ``no-cache`` means do not answer from the cache (the fresh answer may be stored).
- The key covers the tenant, a model-version string (the gateway passes a hash of the
  alias's target list, so a changed route never serves old answers) and a canonical form of
  every request field that can change the output: the decoded body as sorted-key JSON with
  integral floats written as ints, minus the fields in ``IGNORED_FIELDS``. Unknown fields
  stay in, because they are forwarded upstream and may change the answer.
- The store is never a reason to fail a request: ``StoreUnavailableError`` on read is a miss,
  on write the entry is skipped; an entry that no longer decodes is a miss too.
- Entries live ``ttl_s``; entries over ``max_entry_bytes`` are not stored. On the memory
  store the cache keeps its own LRU list of keys and deletes the least recently used beyond
  ``max_entries``; on Redis the bound is the TTL plus Redis' own ``maxmemory-policy``
  (an exact cross-replica LRU would cost a script round trip and a sorted-set write on every
  hit, to enforce a bound that Redis already enforces by memory).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import msgspec

from core.clock import Clock
from core.config_routing import ResponseCacheConfig
from core.wire import ChatRequest, ChatResponse
from policies.response_cache_stream import StreamAccumulator, accumulate, chunks_of
from policies.store.base import Store, StoreUnavailableError

__all__ = [
    "CachedResponse",
    "ResponseCache",
    "StreamAccumulator",
    "accumulate",
    "cache_directives",
    "canonical_body",
    "chunks_of",
    "deterministic",
]

# Fields that never change what the model answers:
# - stream, stream_options: only the framing of the same answer (a cached answer is replayed
#   as a stream when asked for one);
# - user, safety_identifier: end-user ids for the vendor's abuse monitoring;
# - metadata, store: tags for OpenAI's stored completions, not inputs to the model;
# - prompt_cache_key: routes to the vendor's prompt cache, which never changes the output.
IGNORED_FIELDS = frozenset(
    {
        "stream",
        "stream_options",
        "user",
        "safety_identifier",
        "metadata",
        "store",
        "prompt_cache_key",
    }
)
KEY_PREFIX = "response_cache:"

_body_decoder = msgspec.json.Decoder(dict[str, Any])
_canonical_encoder = msgspec.json.Encoder(order="sorted")


class CachedResponse(msgspec.Struct):
    """A stored answer and when it was stored (wall-clock seconds)."""

    response: ChatResponse
    stored_at: float

    def age_s(self, now: float) -> float:
        """Seconds since the answer was stored (for an ``Age`` header)."""
        return max(0.0, now - self.stored_at)


_entry_encoder = msgspec.json.Encoder()
_entry_decoder = msgspec.json.Decoder(CachedResponse)


def cache_directives(headers: Mapping[str, str]) -> set[str]:
    """The lower-cased directives of the client's ``Cache-Control`` header(s)."""
    values = [v for k, v in headers.items() if k.lower() == "cache-control"]
    return {part.strip().split("=")[0].lower() for v in values for part in v.split(",")} - {""}


def deterministic(req: ChatRequest) -> bool:
    """True when the same request should always get the same answer."""
    if req.n is not None and req.n != 1:
        return False
    return req.temperature == 0 or req.seed is not None


def canonical_body(raw_body: bytes) -> bytes:
    """Sorted-key JSON of the body's output-relevant fields (``raw_body`` must be a JSON
    object; the gateway has already validated it)."""
    body = _body_decoder.decode(raw_body)
    kept = {k: _normalise(v) for k, v in body.items() if k not in IGNORED_FIELDS}
    return _canonical_encoder.encode(kept)


def _normalise(value: Any) -> Any:
    """``0.0`` and ``0`` are the same JSON number to every upstream: write both as ``0``."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    return value


class ResponseCache:
    """The cache (see the module docstring). ``clock.wall()`` stamps entries."""

    def __init__(self, config: ResponseCacheConfig, store: Store, clock: Clock) -> None:
        self.config = config
        self._store = store
        self._clock = clock
        self._lru: OrderedDict[str, None] | None = OrderedDict() if store.name == "memory" else None
        self.errors = 0  # store failures absorbed (reads as misses, writes skipped)
        self.too_big = 0  # answers not stored for their size

    # ------------------------------------------------------------ decisions
    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def cacheable(self, req: ChatRequest, headers: Mapping[str, str]) -> bool:
        """May the answer to ``req`` be stored? (Enabled, deterministic, no ``no-store``.)"""
        if not self.config.enabled or not deterministic(req):
            return False
        return "no-store" not in cache_directives(headers)

    @staticmethod
    def may_read(headers: Mapping[str, str]) -> bool:
        """For a cacheable request: may it be answered from the cache? (No ``no-cache``.)"""
        return "no-cache" not in cache_directives(headers)

    def readable(self, req: ChatRequest, headers: Mapping[str, str]) -> bool:
        """May ``req`` be answered from the cache? (Cacheable and no ``no-cache``.)"""
        return self.cacheable(req, headers) and self.may_read(headers)

    def key(self, tenant: str | None, model_version: str, raw_body: bytes) -> str:
        """The store key for this tenant, model version and request body."""
        scope = (tenant or "").encode()
        digest = hashlib.sha256()
        for part in (scope, model_version.encode(), canonical_body(raw_body)):
            # Length-prefixed so no two different (tenant, version, body) triples collide.
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
        return f"{KEY_PREFIX}{tenant or '-'}:{digest.hexdigest()}"

    # ------------------------------------------------------------ storage
    async def get(self, key: str) -> CachedResponse | None:
        """The stored answer, or None (miss, store unreachable, unreadable entry)."""
        try:
            raw = await self._store.get(key)
        except StoreUnavailableError:
            self.errors += 1
            return None
        if raw is None:
            self._forget(key)
            return None
        try:
            entry = _entry_decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        self._touch(key)
        return entry

    async def put(self, key: str, response: ChatResponse) -> None:
        """Store ``response`` for ``ttl_s``; skipped when too big or the store is down
        (never raises for either, so it can run as a background task)."""
        data = _entry_encoder.encode(CachedResponse(response, self._clock.wall()))
        if len(data) > self.config.max_entry_bytes:
            self.too_big += 1
            return
        try:
            await self._store.set(key, data, ttl_s=self.config.ttl_s)
            self._touch(key)
            await self._evict()
        except StoreUnavailableError:
            self.errors += 1

    def _touch(self, key: str) -> None:
        if self._lru is not None:
            self._lru[key] = None
            self._lru.move_to_end(key)

    def _forget(self, key: str) -> None:
        if self._lru is not None:
            self._lru.pop(key, None)

    async def _evict(self) -> None:
        if self._lru is None:
            return
        while len(self._lru) > self.config.max_entries:
            oldest, _ = self._lru.popitem(last=False)
            await self._store.delete(oldest)
