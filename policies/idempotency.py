"""Idempotency keys: one run per (caller scope, key), its 2xx answer kept for retries.

One store key per (scope, client key) holds one record, a plain string value:

- ``P`` + fingerprint (64 hex) + owner (32 hex): a request is running with this key. The
  owner token is random per run; only its holder may renew, complete or release the
  claim. The claim expires after ``claim_ttl_s`` unless renewed, so a replica that died
  mid-request frees its keys by itself.
- ``D`` + fingerprint + msgpack ``StoredAnswer``: the finished answer, kept ``ttl_s``.

Operations (each one atomic ``Script``, Lua on Redis and a Python twin on memory):

CLAIM    KEYS: key. ARGV: fingerprint, owner, claim ttl (ms). Writes the claim when the key
         is free and returns 1; otherwise returns the record as it is (no change).
RENEW    KEYS: key. ARGV: owner, claim ttl (ms). Extends our claim; 1, or 0 if not ours.
COMPLETE KEYS: key. ARGV: owner, record, ttl (ms). Replaces our claim (or a lapsed, absent
         one) with the answer; 0 when another run holds the key or an answer is there.
RELEASE  KEYS: key. ARGV: owner. Deletes our claim; 1, or 0 if not ours.

``claim_or_wait`` is what the edge calls: claim, and while another run holds the key with
the same fingerprint, poll (backing off, and woken at once when a run in this process
ends) until that run stores its answer (a ``Replay``), frees the key (then this caller
claims it and runs), or ``wait_s`` passes (``PENDING``). A different fingerprint under the
key is ``MISMATCH``, whatever the record's state.

Store outages are the caller's to handle: ``claim_or_wait`` raises
``StoreUnavailableError``; ``renew``, ``complete`` and ``release`` absorb it (count it in
``errors``) because they run after the answer is decided, and an unreleased claim lapses.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import weakref
from collections import Counter
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from core.clock import Clock
from core.tenancy import Principal
from policies.store.base import MemoryData, Script, Store, StoreUnavailableError, Value

KEY_PREFIX = "idempotency:"
MAX_KEY_CHARS = 255
FIRST_POLL_S = 0.01  # a retry's first look again; doubles up to MAX_POLL_S
MAX_POLL_S = 0.25
_FINGERPRINT_CHARS = 64
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class StoredAnswer(msgspec.Struct, array_like=True):
    """An answer as the client received it: status, headers (ASGI byte pairs) and body."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


class Claimed(msgspec.Struct, frozen=True):
    """This caller holds the key: run the request, then ``complete`` or ``release``."""

    owner: str
    fingerprint: str


class Replay(msgspec.Struct, frozen=True):
    """An earlier run with the same key and fingerprint stored this answer."""

    answer: StoredAnswer


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


PENDING: Final = _Marker("PENDING")  # another run with this key is still going
MISMATCH: Final = _Marker("MISMATCH")  # the key was used with another request body
Outcome = Claimed | Replay | _Marker


class UnreadableRecordError(StoreUnavailableError):
    """A stored answer that no longer decodes (written by another version): handled like
    an outage (the request runs without the key's protection) rather than as a 500."""


def invalid_key(key: str) -> str | None:
    """Why ``key`` is not an acceptable ``Idempotency-Key`` (None when it is)."""
    if not key:
        return "The Idempotency-Key header must not be empty."
    if len(key) > MAX_KEY_CHARS:
        return f"The Idempotency-Key header is longer than {MAX_KEY_CHARS} characters."
    if _CONTROL.search(key):
        return "The Idempotency-Key header must not contain control characters."
    return None


def scope_of(principal: Principal) -> str:
    """Whose key space a caller uses: its tenant (all of a tenant's keys share it), the
    admin key's own, or the open gateway's."""
    if principal.tenant is not None:
        return f"t:{principal.tenant}"
    return "admin" if principal.admin else "open"


def fingerprint(method: str, path: str, query: bytes, body: bytes) -> str:
    """SHA-256 (hex) of what makes two requests "the same": method, path, query, body
    (length-prefixed, so no two different tuples share a digest input)."""
    digest = hashlib.sha256()
    for part in (method.encode(), path.encode(), query, body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


# -- scripts --------------------------------------------------------------------------------

_OURS_LUA = """
local function ours(v, owner)
  return v and string.sub(v, 1, 1) == 'P' and string.sub(v, 66) == owner
end
"""

CLAIM_LUA = """
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], 'P' .. ARGV[1] .. ARGV[2], 'PX', ARGV[3])
return 1
"""

RENEW_LUA = (
    _OURS_LUA
    + """
if not ours(redis.call('GET', KEYS[1]), ARGV[1]) then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
)

COMPLETE_LUA = (
    _OURS_LUA
    + """
local v = redis.call('GET', KEYS[1])
if v and not ours(v, ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""
)

RELEASE_LUA = (
    _OURS_LUA
    + """
if not ours(redis.call('GET', KEYS[1]), ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""
)


def _text(value: Value) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _ours(value: Any, owner: Value) -> bool:
    return isinstance(value, bytes) and value[:1] == b"P" and value[65:] == _text(owner)


def _claim(data: MemoryData, keys: Sequence[str], args: Sequence[Value], now: float) -> Any:
    current = data.get(keys[0])
    if current is not None:
        return current
    data.set(keys[0], b"P" + _text(args[0]) + _text(args[1]))
    data.expire(keys[0], int(args[2]) / 1000)
    return 1


def _renew(data: MemoryData, keys: Sequence[str], args: Sequence[Value], now: float) -> int:
    if not _ours(data.get(keys[0]), args[0]):
        return 0
    data.expire(keys[0], int(args[1]) / 1000)
    return 1


def _complete(data: MemoryData, keys: Sequence[str], args: Sequence[Value], now: float) -> int:
    current = data.get(keys[0])
    if current is not None and not _ours(current, args[0]):
        return 0
    data.set(keys[0], _text(args[1]))
    data.expire(keys[0], int(args[2]) / 1000)
    return 1


def _release(data: MemoryData, keys: Sequence[str], args: Sequence[Value], now: float) -> int:
    if not _ours(data.get(keys[0]), args[0]):
        return 0
    data.delete(keys[0])
    return 1


CLAIM = Script("idempotency.claim", CLAIM_LUA, _claim)
RENEW = Script("idempotency.renew", RENEW_LUA, _renew)
COMPLETE = Script("idempotency.complete", COMPLETE_LUA, _complete)
RELEASE = Script("idempotency.release", RELEASE_LUA, _release)

_answer_encoder = msgspec.msgpack.Encoder()
_answer_decoder = msgspec.msgpack.Decoder(StoredAnswer)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class IdempotencyKeys:
    """The claims and stored answers in ``store`` (see the module docstring). ``clock``
    bounds waits (``now()``)."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        # Runs of this process wake their local waiters when they end; a waiter on another
        # replica polls. Weak values: an event lives as long as someone waits on it.
        self._ended: weakref.WeakValueDictionary[str, asyncio.Event] = weakref.WeakValueDictionary()
        self.errors = 0  # store failures absorbed by renew, complete and release
        # claim attempts by what they found: "claimed", "replayed", "mismatch" (a wait's
        # repeated "pending" polls are not counted), for the metrics
        self.outcomes: Counter[str] = Counter()

    @staticmethod
    def key(scope: str, client_key: str) -> str:
        """The store key: the scope as is, the client's key hashed (any characters, any
        length up to the limit, one bounded store key)."""
        return f"{KEY_PREFIX}{scope}:{hashlib.sha256(client_key.encode()).hexdigest()}"

    async def claim(self, key: str, fingerprint: str, claim_ttl_s: float) -> Outcome:
        """One attempt: ``Claimed``, ``Replay``, ``PENDING`` or ``MISMATCH``."""
        owner = os.urandom(16).hex()
        found = await self._store.run(CLAIM, [key], [fingerprint, owner, _ms(claim_ttl_s)])
        outcome = (
            Claimed(owner, fingerprint)
            if isinstance(found, int)
            else self._read(_text(found), fingerprint)
        )
        if isinstance(outcome, Claimed):
            self.outcomes["claimed"] += 1
        elif isinstance(outcome, Replay):
            self.outcomes["replayed"] += 1
        elif outcome is MISMATCH:
            self.outcomes["mismatch"] += 1
        return outcome

    @staticmethod
    def _read(record: bytes, fingerprint: str) -> Outcome:
        if record[1 : 1 + _FINGERPRINT_CHARS] != fingerprint.encode():
            return MISMATCH
        if record[:1] == b"P":
            return PENDING
        try:
            return Replay(_answer_decoder.decode(record[1 + _FINGERPRINT_CHARS :]))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise UnreadableRecordError(f"unreadable idempotency record: {exc}") from exc

    async def claim_or_wait(
        self, key: str, fingerprint: str, claim_ttl_s: float, wait_s: float
    ) -> Outcome:
        """Claim the key, or wait up to ``wait_s`` while another run with the same
        fingerprint holds it; ``PENDING`` when it still does then."""
        deadline = self._clock.now() + wait_s
        delay = FIRST_POLL_S
        while True:
            outcome = await self.claim(key, fingerprint, claim_ttl_s)
            left = deadline - self._clock.now()
            if outcome is not PENDING or left <= 0:
                return outcome
            await self._nap(key, min(delay, left))
            delay = min(delay * 2, MAX_POLL_S)

    async def _nap(self, key: str, seconds: float) -> None:
        event = self._ended.get(key)
        if event is None:
            event = self._ended[key] = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), seconds)

    def _wake(self, key: str) -> None:
        event = self._ended.pop(key, None)
        if event is not None:
            event.set()

    async def renew(self, key: str, claim: Claimed, claim_ttl_s: float) -> bool:
        """Extend our claim; False when it is no longer ours (lapsed) or the store failed."""
        return await self._absorbing(RENEW, key, [claim.owner, _ms(claim_ttl_s)])

    async def complete(self, key: str, claim: Claimed, answer: StoredAnswer, ttl_s: float) -> bool:
        """Store ``answer`` in place of our claim for ``ttl_s``; False when not stored
        (another run holds the key, or the store failed)."""
        record = b"D" + claim.fingerprint.encode() + _answer_encoder.encode(answer)
        try:
            return await self._absorbing(COMPLETE, key, [claim.owner, record, _ms(ttl_s)])
        finally:
            self._wake(key)

    async def release(self, key: str, claim: Claimed) -> bool:
        """Free our claim so that the next request with the key runs."""
        try:
            return await self._absorbing(RELEASE, key, [claim.owner])
        finally:
            self._wake(key)

    async def _absorbing(self, script: Script, key: str, args: list[Value]) -> bool:
        try:
            return bool(await self._store.run(script, [key], args))
        except StoreUnavailableError:
            self.errors += 1
            return False
