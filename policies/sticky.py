"""Sticky routes for the providers' prompt caches.

A provider's prompt cache (Anthropic ``cache_control``, OpenAI's automatic prefix cache)
lives with one provider/model, so a tenant's requests that share a long stable prefix
(system prompt and tools) should keep going to the target that served that prefix last.
``StickyRoutes`` remembers (tenant, prefix hash) -> target label for ``ttl_s`` (about the
providers' own cache lifetime, 5 minutes by default); ``routers.sticky.prefer`` applies it.

Stickiness is an optimisation, never a reason to fail: a store error reads as "no sticky
target" and skips the write.
"""

from __future__ import annotations

import hashlib

import msgspec

from core.clock import Clock
from core.wire import ChatRequest, Message, TextPart
from policies.store.base import Store, StoreUnavailableError

KEY_PREFIX = "sticky:"
_encoder = msgspec.json.Encoder(order="sorted")


def stable_prefix_hash(req: ChatRequest, min_chars: int) -> str | None:
    """A hash of the request's stable prefix (tools, then the leading system/developer
    messages), or None when that prefix is shorter than ``min_chars`` characters, since a
    prefix the provider will not cache is not worth pinning a route for."""
    tools = _encoder.encode(req.tools) if req.tools else b""
    system = [_text(m) for m in _leading_system(req.messages)]
    size = len(tools) + sum(len(text) for text in system)
    if size < min_chars:
        return None
    digest = hashlib.sha256(tools)
    for text in system:
        digest.update(b"\x00")
        digest.update(text.encode())
    return digest.hexdigest()[:32]


def _leading_system(messages: list[Message]) -> list[Message]:
    leading = []
    for message in messages:
        if message.role not in ("system", "developer"):
            break
        leading.append(message)
    return leading


def _text(message: Message) -> str:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    return "".join(p.text for p in message.content if isinstance(p, TextPart))


class StickyRoutes:
    """(tenant, prefix hash) -> target label, with a TTL, in the shared store.

    ``remember`` rewrites an unchanged mapping at most every ``ttl_s / 4`` seconds (on
    ``clock.now()``), so a hot prefix costs one store write per quarter TTL per replica, not
    one per request, while its entry still never expires as long as it is used.
    """

    def __init__(self, store: Store, ttl_s: float, clock: Clock) -> None:
        self._store = store
        self._ttl_s = ttl_s
        self._clock = clock
        self._written: dict[str, tuple[str, float]] = {}  # key -> (label, when written)
        self.errors = 0

    @staticmethod
    def key(tenant: str | None, prefix_hash: str | int) -> str:
        return f"{KEY_PREFIX}{tenant or '-'}:{prefix_hash}"

    async def lookup(self, tenant: str | None, prefix_hash: str | int) -> str | None:
        """The label of the target that last served this prefix, or None."""
        try:
            raw = await self._store.get(self.key(tenant, prefix_hash))
        except StoreUnavailableError:
            self.errors += 1
            return None
        return raw.decode() if raw else None

    async def remember(self, tenant: str | None, prefix_hash: str | int, label: str) -> None:
        """Record that ``label`` served this prefix (refreshing the TTL)."""
        key = self.key(tenant, prefix_hash)
        now = self._clock.now()
        last = self._written.get(key)
        if last is not None and last[0] == label and now - last[1] < self._ttl_s / 4:
            return
        try:
            await self._store.set(key, label.encode(), ttl_s=self._ttl_s)
        except StoreUnavailableError:
            self.errors += 1
            return
        self._written[key] = (label, now)
        if len(self._written) > 10_000:  # bound the memo; it only saves writes
            self._written.pop(next(iter(self._written)))
