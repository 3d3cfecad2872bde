"""``Idempotency-Key`` on the synchronous endpoints: a retry gets the first answer, and the
first is billed once (docs/idempotency.md).

An ASGI middleware outside ``finish_abandoned``. Only a POST to one of ``PATHS`` that
carries the header (and ``idempotency.enabled``) is handled here; everything else goes
straight to the application. For such a request, in order:

1. Authenticate with the runtime's authenticator; a caller it refuses is passed on, so the
   application answers its usual 401. Then the key is checked (400 when empty, longer than
   255 characters or holding control characters).
2. Read the whole body (at most ``server.max_body_bytes``; a larger one, or a client that
   leaves while sending it, is passed on as it came for the application to refuse).
3. ``IdempotencyKeys.claim_or_wait`` on (the caller's tenant, the key), with the SHA-256 of
   method, path, query and body as fingerprint:

   - claimed: the application runs in a task of its own, with a ``receive`` that reports
     ``http.disconnect`` only after the whole response was sent, so the request runs to its
     end when the client leaves (the point of the key: the client's retry must find the
     answer, not pay again; ``finish_abandoned`` never sees the client go) and when the
     server cancels the connection's task. Every message is forwarded to the client while
     it listens, and recorded. A 2xx answer that ended cleanly (a stream: with its final
     event) is stored for ``ttl_s``; anything else frees the key, so that a retry runs
     again: a 429, a 5xx or a stream cut by an upstream failure are exactly what a client
     retries, and replaying them would make the failure permanent. The claim is renewed
     while the request runs and freed if the task itself is cancelled (event loop ending).
   - a stored answer (same fingerprint): replayed byte for byte, headers included (they
     name the original request), plus ``idempotent-replayed: true``. The replay never
     enters the pipeline: no quota is taken, no upstream called, no ledger row written, so
     the key's request is billed once.
   - in flight elsewhere (same fingerprint): wait up to ``wait_s`` and replay its answer
     (a stream is replayed whole when it has ended); if that run failed, this request
     claims the key and runs. Still running at the deadline: 409.
   - the key was used with another body: 422 ``idempotency_key_reused``.

   Errors are in the path's dialect (``by_prefix``, as ``errors.exception_handlers``).
   When the store is unreachable the request runs as if it had no key (availability over
   deduplication), and a warning is logged.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from typing import Any, cast

import structlog
from litestar.enums import ScopeType
from litestar.types import ASGIApp, HTTPScope, Message, Receive, ReceiveMessage, Send
from litestar.types import Scope as ASGIScope

from core.config_idempotency import IdempotencyConfig
from core.errors import GatewayError, InvalidRequestError
from gateway.http.channel import body_then_disconnect
from gateway.http.errors import ErrorShape, error_headers, openai_shape
from policies.idempotency import (
    MISMATCH,
    PENDING,
    Claimed,
    IdempotencyKeys,
    Replay,
    StoredAnswer,
    fingerprint,
    invalid_key,
    scope_of,
)
from policies.store.base import StoreUnavailableError

_log = structlog.get_logger("switchyard")
_ENDPOINTS = ("chat/completions", "completions", "responses", "messages", "embeddings")
PATHS = frozenset(f"/v1/{endpoint}" for endpoint in _ENDPOINTS)
HEADER = b"idempotency-key"
STATE_KEY = "idempotency"  # where the app's ``IdempotencyKeys`` lives in ``app.state``

# Runs whose clients may be gone: held here so that the event loop keeps them to their end.
_RUNS: set[asyncio.Task[None]] = set()


class KeyReusedError(GatewayError):
    status = 422
    type = "invalid_request_error"
    code = "idempotency_key_reused"


class KeyInUseError(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "idempotency_key_in_use"


def idempotency_keys(
    by_prefix: Mapping[str, ErrorShape] | None = None,
) -> Callable[[ASGIApp], ASGIApp]:
    """A Litestar middleware factory: errors in ``by_prefix``'s shape under its path
    prefixes, OpenAI's elsewhere."""
    prefixes = sorted((by_prefix or {}).items(), key=lambda item: -len(item[0]))

    def shape_for(path: str) -> ErrorShape:
        return next((s for prefix, s in prefixes if path.startswith(prefix)), openai_shape)

    def wrap(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: ASGIScope, receive: Receive, send: Send) -> None:
            key = _key_of(scope)
            if key is None:
                await app(scope, receive, send)
                return
            keyed = _Keyed(app, cast(HTTPScope, scope), receive, send, shape_for(scope["path"]))
            await keyed.run(key)

        return middleware

    return wrap


def _key_of(scope: ASGIScope) -> bytes | None:
    """The raw header of a request this middleware handles, else None (cheap)."""
    if scope["type"] != ScopeType.HTTP or scope["method"] != "POST" or scope["path"] not in PATHS:
        return None
    return next((value for name, value in scope["headers"] if name == HEADER), None)


class _Keyed:
    """One request that carries a key."""

    def __init__(
        self, app: ASGIApp, scope: HTTPScope, receive: Receive, send: Send, shape: ErrorShape
    ) -> None:
        self._app = app
        self._scope = scope
        self._receive = receive
        self._send = send
        self._shape = shape
        self._gateway: Any = scope["app"].state.gateway
        self._received: list[ReceiveMessage] = []  # what was read, to hand on when passing
        self._settings = IdempotencyConfig()  # the runtime's, once ``run`` has read it

    async def run(self, raw_key: bytes) -> None:
        runtime = self._gateway.runtime
        self._settings = settings = runtime.config.idempotency
        if not settings.enabled:
            await self._pass()
            return
        try:
            principal = runtime.auth.authenticate(_headers(self._scope))
        except GatewayError:
            await self._pass()  # the application answers 401 as it always does
            return
        key = raw_key.decode("latin-1")
        problem = invalid_key(key)
        if problem is not None:
            await self._refuse(InvalidRequestError(problem, param="Idempotency-Key"))
            return
        body = await self._read_body(runtime.config.server.max_body_bytes)
        if body is None:
            await self._pass()
            return
        await self._decide(IdempotencyKeys.key(scope_of(principal), key), body)

    async def _decide(self, store_key: str, body: bytes) -> None:
        keys, settings = self._keys(), self._settings
        scope = self._scope
        digest = fingerprint(scope["method"], scope["path"], scope.get("query_string", b""), body)
        try:
            outcome = await keys.claim_or_wait(
                store_key, digest, settings.claim_ttl_s, settings.wait_s
            )
        except StoreUnavailableError as exc:
            _log.warning("idempotency.store_unavailable", error=str(exc))
            await self._pass()
            return
        if isinstance(outcome, Claimed):
            await self._run_claimed(keys, store_key, outcome, body)
        elif isinstance(outcome, Replay):
            await replay(self._send, outcome.answer)
        elif outcome is MISMATCH:
            message = "This Idempotency-Key was already used with a different request body."
            await self._refuse(KeyReusedError(message, param="Idempotency-Key"))
        elif outcome is PENDING:
            message = "A request with this Idempotency-Key is still in progress; retry later."
            await self._refuse(KeyInUseError(message, retry_after=1.0))

    def _keys(self) -> IdempotencyKeys:
        """The app's ``IdempotencyKeys`` over the shared store (made on first use)."""
        state = self._scope["app"].state
        keys: IdempotencyKeys | None = state.get(STATE_KEY)
        if keys is None:
            keys = state[STATE_KEY] = IdempotencyKeys(
                self._gateway.stores.shared, self._gateway.clock
            )
        return keys

    # -- the claimed run ------------------------------------------------------------------

    async def _run_claimed(
        self, keys: IdempotencyKeys, store_key: str, claim: Claimed, body: bytes
    ) -> None:
        task = asyncio.create_task(self._own_run(keys, store_key, claim, body))
        _RUNS.add(task)
        task.add_done_callback(_RUNS.discard)
        task.add_done_callback(_retrieve)  # a failure nobody awaits any more is not logged
        # A cancelled connection (server shutdown) leaves the run going: shutdown drains it
        # as any request in flight, and its answer is stored for the client's retry.
        await asyncio.shield(task)

    async def _own_run(
        self, keys: IdempotencyKeys, store_key: str, claim: Claimed, body: bytes
    ) -> None:
        """Run the request to its end whoever listens; then store its answer or free the
        key (also when the run fails or is cancelled)."""
        settings = self._settings
        recorder = Recorder(self._send, settings.max_response_bytes)
        renewing = asyncio.create_task(_renew(keys, store_key, claim, settings.claim_ttl_s))
        stored = False
        try:
            await self._app(self._scope, body_then_disconnect(body, recorder.sent), recorder.send)
            answer = recorder.answer()
            if answer is not None:
                stored = await keys.complete(store_key, claim, answer, settings.ttl_s)
        finally:
            renewing.cancel()
            if not stored:
                await keys.release(store_key, claim)

    # -- passing on and refusing ------------------------------------------------------------

    async def _pass(self) -> None:
        """Run the application as if this middleware were not there."""
        pending = list(self._received)

        async def receive() -> ReceiveMessage:
            return pending.pop(0) if pending else await self._receive()

        await self._app(self._scope, receive, self._send)

    async def _read_body(self, limit: int) -> bytes | None:
        """The whole body; None when it is larger than ``limit`` or the client left."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self._receive()
            self._received.append(message)
            if message["type"] != "http.request":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                return None
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse(self, error: GatewayError) -> None:
        request_id = "req_" + os.urandom(12).hex()
        status, body = self._shape(error, request_id)
        headers = {
            **error_headers(error, request_id),
            "content-type": "application/json",
            "content-length": str(len(body)),
        }
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        await self._send({"type": "http.response.start", "status": status, "headers": raw})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})


async def _renew(keys: IdempotencyKeys, store_key: str, claim: Claimed, ttl_s: float) -> None:
    """Keep the claim alive while the request runs (every third of its lease). A failed
    renewal is tried again at the next turn: a lapsed claim only means that a retry
    arriving meanwhile runs too."""
    while True:
        await asyncio.sleep(ttl_s / 3)
        await keys.renew(store_key, claim, ttl_s)


# -- recording and replaying answers ---------------------------------------------------------

# Not part of an answer: they describe one connection or one moment (the server adds its
# own ``date`` and ``server`` to every response, a replay too).
_HOP_BY_HOP = b"connection keep-alive transfer-encoding upgrade te trailer proxy-connection"
_NOT_STORED = frozenset([*_HOP_BY_HOP.split(), b"date", b"server"])
REPLAYED = (b"idempotent-replayed", b"true")
# The last event of a stream that ended well, per dialect: OpenAI's ``data: [DONE]``,
# Anthropic's ``message_stop``, the Responses API's ``response.completed`` or
# ``response.incomplete`` (a length limit is an answer too). A stream that failed after its
# 200 started ends with an error event instead.
_FINAL_EVENTS = (b"message_stop", b"response.completed", b"response.incomplete")


class Recorder:
    """Forwards a run's messages to the client while it listens, and keeps a copy: the
    status, the headers and the body, up to ``limit`` bytes of body."""

    def __init__(self, send: Send, limit: int) -> None:
        self._send = send
        self._limit = limit
        self._listening = True
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self._chunks: list[bytes] = []
        self._size = 0
        self.ended = False  # the last body message was sent
        self.sent = asyncio.Event()  # set with ``ended``
        self.too_big = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.headers = [(bytes(k), bytes(v)) for k, v in message.get("headers") or ()]
        elif message["type"] == "http.response.body":
            self._keep(bytes(message.get("body", b"")))
            self.ended = not message.get("more_body", False)
            if self.ended:
                self.sent.set()
        if not self._listening:
            return
        try:
            await self._send(message)
        except Exception:  # the client is gone (a closed transport): the run goes on
            self._listening = False

    def _keep(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > self._limit:
            self.too_big = True
            self._chunks.clear()
        elif chunk:
            self._chunks.append(chunk)

    def answer(self) -> StoredAnswer | None:
        """The answer to store, or None: not a 2xx, not ended, too big, or a stream that
        did not end with its dialect's final event."""
        status = self.status
        if status is None or not 200 <= status < 300 or not self.ended or self.too_big:
            return None
        body = b"".join(self._chunks)
        if _is_stream(self.headers) and not _ended_well(body):
            return None
        headers = [(k, v) for k, v in self.headers if k.lower() not in _NOT_STORED]
        return StoredAnswer(status, headers, body)


def _is_stream(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(
        k.lower() == b"content-type" and v.lower().startswith(b"text/event-stream")
        for k, v in headers
    )


def _ended_well(body: bytes) -> bool:
    last = body.rstrip(b"\r\n").rsplit(b"\n\n", 1)[-1]
    if last.strip() == b"data: [DONE]":
        return True
    for line in last.splitlines():
        if line.startswith(b"event:"):
            return line[6:].strip() in _FINAL_EVENTS
        if line.startswith(b"data:"):  # no event line: the data's "type" says
            return any(b'"' + kind + b'"' in line for kind in _FINAL_EVENTS)
    return False


async def replay(send: Send, answer: StoredAnswer) -> None:
    """Send a stored answer as it was sent the first time, marked as a replay."""
    headers = [*answer.headers, REPLAYED]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body, "more_body": False})


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def _headers(scope: ASGIScope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
