"""A fake OpenAI-compatible upstream over real HTTP/1.1 (raw asyncio, keep-alive).

Contract:
- ``POST /v1/chat/completions``: streamed (SSE, chunked encoding, usage chunk when
  ``stream_options.include_usage``) or whole JSON; latency from ``menu.draw_ttft_s`` keyed by
  the request's ``user`` field (the benchmark's request key) and the attempt number.
- Managed upstreams refuse above ``spec.limit`` concurrent requests with a 429
  (``retry-after: 1``); the local box (``spec.slots``) serves ``limit`` at once and queues
  the rest FIFO, holding the slot while it decodes.
- During the outage window (``set_outage``) a request is accepted and never answered (no
  headers) until the client closes the connection.
- ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (vLLM gauges; local box only).
- Every accepted request leaves a ``Served`` record. Billing rule: prompt tokens are billed
  for every accepted request, also one cancelled or hung before its first token (managed
  APIs bill input once processing started); completion tokens as sent. 429s are not billed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from bench.routing_e2e import wire
from bench.routing_e2e.menu import LOCAL_KV_TOKENS, UpstreamSpec, completion_tokens, draw_ttft_s

_EVENT_S = 0.5  # group decoded tokens into one SSE event per ~500 ms of decode (low CPU)
_STATUS = {200: "OK", 404: "Not Found", 429: "Too Many Requests", 400: "Bad Request"}


@dataclass(slots=True)
class Served:
    """What one accepted request cost: ``outcome`` is ok, cancelled (client left after
    the first token or while waiting) or hung (outage)."""

    key: str
    prompt_tokens: int
    completion_tokens: int = 0
    outcome: str = "ok"
    first_token: bool = False
    expected: int = 0  # completion tokens the answer has


@dataclass
class UpstreamStats:
    served: list[Served] = field(default_factory=list)
    rejected: int = 0  # 429s
    connections: int = 0  # TCP connections accepted (keep-alive reuse shows here)
    in_flight: int = 0
    high_water: int = 0


class FakeUpstream:
    """One upstream on a loopback port. ``scale`` multiplies every latency (tests)."""

    def __init__(self, spec: UpstreamSpec, seed: int, scale: float = 1.0) -> None:
        self.spec, self.seed, self.scale = spec, seed, scale
        self.stats = UpstreamStats()
        self.outage: tuple[float, float] | None = None  # loop.time() window
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._attempts: dict[str, int] = {}
        self._running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._kv: dict[int, int] = {}
        self._ttft_sum, self._ttft_count = 0.0, 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_outage(self, start: float, end: float) -> None:
        """Hang every chat request that arrives in [start, end) (``loop.time()``)."""
        self.outage = (start, end)

    async def start(self) -> FakeUpstream:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0, backlog=1024)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    # ------------------------------------------------------------------ HTTP
    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        self.stats.connections += 1
        try:
            while await self._one(reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path = lines[0].split(" ")[:2]
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        body = await reader.readexactly(length) if length else b""
        if method == "POST" and path.endswith("/chat/completions"):
            return await self._chat(json.loads(body), reader, writer)
        if method == "GET" and path.endswith("/models"):
            await _send(writer, 200, wire.models([self.spec.name]))
        elif method == "GET" and path == "/health":
            await _send(writer, 200, b"{}")
        elif method == "GET" and path == "/metrics" and self.spec.slots:
            await _send(writer, 200, self.metrics(), "text/plain; version=0.0.4")
        else:
            await _send(writer, 404, wire.error(f"no route {path}", "invalid_request_error"))
        return True

    async def _chat(
        self, body: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Serve one chat request while watching for the client leaving; False: close."""
        watch = asyncio.ensure_future(reader.read(1))
        serve = asyncio.ensure_future(self._serve(body, writer))
        done, _ = await asyncio.wait({watch, serve}, return_when=asyncio.FIRST_COMPLETED)
        if serve in done:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await watch
            try:
                return serve.result()
            except ConnectionError:
                return False
        serve.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await serve
        with contextlib.suppress(ConnectionError):
            watch.result()
        return False

    # ------------------------------------------------------------------ chat
    async def _serve(self, body: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        spec, stats = self.spec, self.stats
        if not spec.slots and stats.in_flight >= spec.limit:
            stats.rejected += 1
            msg = wire.error("concurrency limit reached", "rate_limit_error", "rate_limit_exceeded")
            await _send(writer, 429, msg, extra="retry-after: 1\r\n")
            return True
        key = str(body.get("user") or "anon")
        attempt = self._attempts[key] = self._attempts.get(key, 0) + 1
        record = Served(key, wire.prompt_tokens(body))
        stats.served.append(record)
        stats.in_flight += 1
        stats.high_water = max(stats.high_water, stats.in_flight)
        try:
            return await self._answer(body, writer, record, attempt)
        except (asyncio.CancelledError, ConnectionError):
            # A client that closes after the last content token was served in full.
            if record.outcome == "ok" and record.completion_tokens < max(1, record.expected):
                record.outcome = "cancelled"
            raise
        finally:
            stats.in_flight -= 1

    async def _answer(
        self, body: dict[str, Any], writer: asyncio.StreamWriter, record: Served, attempt: int
    ) -> bool:
        loop = asyncio.get_running_loop()
        if self.outage is not None and self.outage[0] <= loop.time() < self.outage[1]:
            record.outcome = "hung"
            await asyncio.Event().wait()  # until the client leaves (cancelled)
        started = loop.time()
        slot = await self._acquire() if self.spec.slots else False
        try:
            ttft = draw_ttft_s(self.spec, self.seed, record.key, attempt, record.prompt_tokens)
            await asyncio.sleep(ttft * self.scale)
            if slot:
                self._ttft_sum += loop.time() - started
                self._ttft_count += 1
            return await self._emit(body, writer, record, id(record))
        finally:
            if slot:
                self._kv.pop(id(record), None)
                self._release()

    async def _emit(
        self, body: dict[str, Any], writer: asyncio.StreamWriter, record: Served, kv_key: int
    ) -> bool:
        """Write the answer (the first token is due now); True when the connection stays."""
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 256)
        total = record.expected = completion_tokens(self.seed, record.key, max_tokens)
        reason = "length" if total >= max_tokens else "stop"
        rid, model = f"chatcmpl-{record.key}", str(body.get("model", self.spec.name))
        per_event = max(1, round(_EVENT_S / self.spec.decode_s_per_token))
        if not body.get("stream"):
            await asyncio.sleep(total * self.spec.decode_s_per_token * self.scale)
            record.first_token, record.completion_tokens = True, total
            text = wire.TOKEN_TEXT * total
            out = wire.completion(rid, model, text, reason, record.prompt_tokens, total)
            await _send(writer, 200, out)
            return True
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        sent = 0
        while sent < total:
            n = 1 if sent == 0 else min(per_event, total - sent)
            if sent:
                await asyncio.sleep(n * self.spec.decode_s_per_token * self.scale)
            _chunk(writer, wire.delta_chunk(rid, model, wire.TOKEN_TEXT * n, role=sent == 0))
            sent += n
            record.first_token, record.completion_tokens = True, sent
            self._kv[kv_key] = record.prompt_tokens + sent
            await writer.drain()
        tail = wire.finish_chunk(rid, model, reason)
        if (body.get("stream_options") or {}).get("include_usage"):
            tail += wire.usage_chunk(rid, model, record.prompt_tokens, total)
        _chunk(writer, tail + wire.DONE)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    # ------------------------------------------------------------------ local slots
    async def _acquire(self) -> bool:
        """Take a slot, waiting FIFO behind earlier requests when all are busy."""
        if self._running < self.spec.limit and not self._waiters:
            self._running += 1
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # the slot was handed over just as we left
            else:
                with contextlib.suppress(ValueError):  # ``_release`` may have dropped it
                    self._waiters.remove(waiter)
            raise
        return True  # the releaser handed its slot over (``_running`` unchanged)

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._running -= 1

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def metrics(self) -> bytes:
        """The vLLM metrics page for the current load."""
        kv = min(1.0, sum(self._kv.values()) / LOCAL_KV_TOKENS)
        return wire.metrics_page(
            self.spec.name, self._running, len(self._waiters), kv, self._ttft_sum, self._ttft_count
        )


def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")


async def _send(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes,
    ctype: str = "application/json",
    extra: str = "",
) -> None:
    head = (
        f"HTTP/1.1 {status} {_STATUS.get(status, 'Error')}\r\ncontent-type: {ctype}\r\n"
        f"content-length: {len(body)}\r\n{extra}\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
