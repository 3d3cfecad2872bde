"""Slow and idle connections against a real ``switchyard serve`` process (issue 10, defect 4).

Hostile clients: sockets that send nothing, half a request header, a header line every few
tenths of a second (slowloris), a 1 MB header, more connections than the cap, and streaming
clients that never read their response. Invariants: the gateway closes what sends nothing
useful within its configured deadlines, refuses what is too large, keeps answering
``/healthz`` throughout, keeps keep-alive working for real clients, and a request whose
client never reads ends after ``server.send_timeout_s`` and gives back its tenant's
concurrency slot. Every loop is bounded; everything runs on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway.process.server import GuardedHttpToolsProtocol
from policies.auth import KeysFile
from tests.fixtures.asgi import end_body, read_request, send_chunk, start_sse
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.server import serve
from tests.integration.processes import GatewayProcess

pytestmark = pytest.mark.hostile

HEADER_TIMEOUT_S = 1.5  # server.header_timeout_s in the gateway under test
KEEP_ALIVE_S = 1.0  # server.keep_alive_timeout_s
SEND_TIMEOUT_S = 1.5  # server.send_timeout_s
MAX_CONNECTIONS = 400  # server.max_connections
SLACK_S = 3.0  # generous allowance on top of a deadline for a loaded CI machine
STUCK_READERS = 4  # the `stuck` tenant's concurrency, and how many never-reading clients
ENDLESS_CHUNK = "x" * 32768
ENDLESS_CHUNKS = 4000  # ~128 MB at most: the upstream stream ends even if nothing stops it


async def endless_upstream(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An OpenAI-shaped stream that keeps sending 32 KiB content deltas (bounded), as fast as
    the gateway reads them: what fills a non-reading client's socket buffers."""
    if scope["type"] != "http":
        return
    await read_request(scope, receive)
    await start_sse(send)
    for index in range(ENDLESS_CHUNKS):
        delta = {"role": "assistant", "content": ""} if index == 0 else {"content": ENDLESS_CHUNK}
        chunk = {
            "id": "chatcmpl-endless",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "m-endless",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
        }
        await send_chunk(send, b"data: " + json.dumps(chunk).encode() + b"\n\n")
        if index % 16 == 0:
            await asyncio.sleep(0)
    await send_chunk(send, b"data: [DONE]\n\n")
    await end_body(send)


@dataclass
class Gateway:
    process: GatewayProcess
    keys: dict[str, str]  # tenant -> API key

    @property
    def port(self) -> int:
        return self.process.port

    def log(self) -> str:
        return self.process.log_path.read_text()[-4000:]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    folder = tmp_path_factory.mktemp("connections")
    keys_file = KeysFile(folder / "keys.json")
    keys = {t: keys_file.create(t, "hostile")[0] for t in ("stuck", "crowd")}
    with ExitStack() as stack:
        fake = stack.enter_context(serve(FakeOpenAI()))
        endless = stack.enter_context(serve(endless_upstream))
        config = folder / "gateway.yaml"
        config.write_text(f"""
server:
  watch_config: false
  header_timeout_s: {HEADER_TIMEOUT_S}
  keep_alive_timeout_s: {KEEP_ALIVE_S}
  send_timeout_s: {SEND_TIMEOUT_S}
  max_connections: {MAX_CONNECTIONS}
logging: {{level: info}}
auth: {{keys_file: {folder / "keys.json"}}}
tenants:
  stuck: {{limits: {{concurrency: {STUCK_READERS}}}}}
  crowd: {{limits: {{concurrency: 1000}}}}
ledger: {{path: {folder / "usage.sqlite3"}}}
providers:
  fake: {{type: openai, base_url: "{fake.url}/v1", api_key_env: HOSTILE_CONN_KEY}}
  endless: {{type: openai, base_url: "{endless.url}/v1", api_key_env: HOSTILE_CONN_KEY}}
models:
  count: {{targets: [{{provider: fake, model: m-count}}]}}
  endless: {{targets: [{{provider: endless, model: m-endless}}]}}
""")
        process = GatewayProcess(config, {"HOSTILE_CONN_KEY": "sk-test"}, folder / "gateway.log")
        yield Gateway(stack.enter_context(process), keys)


def test_uvicorn_still_has_what_the_guards_build_on() -> None:
    """gateway/server.py overrides uvicorn internals: fail loudly, not subtly, on an upgrade
    that renames them."""
    own = {"limits"} | {n for n in vars(GuardedHttpToolsProtocol) if not n.startswith("_")}
    assert own - {"limits"} <= set(dir(HttpToolsProtocol))
    cycle = RequestResponseCycle.__init__.__code__.co_names
    assert {"response_complete", "keep_alive"} <= set(cycle)
    assert "timeout_keep_alive_task" in HttpToolsProtocol.__init__.__code__.co_names


# --- raw socket helpers -------------------------------------------------------------------


def connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connect, so that the advertised window stays small
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(5.0)
    sock.connect(("127.0.0.1", port))
    return sock


def request_bytes(path: str = "/healthz", extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: gateway\r\n{extra}\r\n".encode()


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a content-length (what /healthz sends): (status, body);
    (0, b"") when the server closed the connection instead."""
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            piece = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return 0, b""
        if not piece:
            return 0, b""
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    while len(body) < length:
        piece = sock.recv(65536)
        if not piece:
            break
        body += piece
    return int(lines[0].split()[1]), body


def open_after(socks: list[socket.socket], seconds: float) -> list[socket.socket]:
    """Wait until the server has closed every socket (EOF or reset, after any error response
    it sends first) or ``seconds`` pass; return the sockets still open then."""
    selector = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, data=sock)
    still_open = set(socks)
    deadline = time.monotonic() + seconds
    while still_open and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=0.1):
            sock = key.data
            try:
                closed = sock.recv(65536) == b""
            except (ConnectionResetError, BrokenPipeError):
                closed = True
            except BlockingIOError:
                closed = False
            if closed:
                selector.unregister(sock)
                still_open.discard(sock)
    selector.close()
    return [s for s in socks if s in still_open]


def healthz(port: int) -> int:
    return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10.0).status_code


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    """Sockets a test opens; all closed at its end, whatever happened."""
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


# --- idle, half-header and slow-header clients ---------------------------------------------


def test_idle_and_half_header_connections_are_closed(
    gateway: Gateway, sockets: list[socket.socket]
) -> None:
    """200 connections that send nothing and 50 that send half a header: all closed by the
    server shortly after ``header_timeout_s``, while /healthz keeps answering."""
    idle = [connect(gateway.port) for _ in range(200)]
    half = [connect(gateway.port) for _ in range(50)]
    sockets.extend(idle + half)
    for sock in half:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nX-Slow: ")
    for _ in range(3):
        assert healthz(gateway.port) == 200
    left = open_after(idle + half, HEADER_TIMEOUT_S + SLACK_S)
    assert not left, f"{len(left)} of {len(idle) + len(half)} connections still open"
    assert healthz(gateway.port) == 200


def test_slowloris_is_cut_off_at_the_total_header_deadline(
    gateway: Gateway, sockets: list[socket.socket]
) -> None:
    """A client that sends one header line every 0.3 s (each read arrives quickly, the
    header never ends) is disconnected by the total header deadline, not kept forever."""
    sock = connect(gateway.port)
    sockets.append(sock)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n")
    started = time.monotonic()
    closed_after: float | None = None
    for line in range(40):  # 12 s of trickle at most
        if not open_after([sock], 0.3):
            closed_after = time.monotonic() - started
            break
        try:
            sock.sendall(f"X-Trickle-{line}: {'a' * 20}\r\n".encode())
        except (BrokenPipeError, ConnectionResetError):
            closed_after = time.monotonic() - started
            break
    assert closed_after is not None, "the slow-header client was never disconnected"
    assert closed_after < HEADER_TIMEOUT_S + SLACK_S


def test_keep_alive_survives_many_requests_and_idle_connections_end(
    gateway: Gateway, sockets: list[socket.socket]
) -> None:
    """One connection serves requests for longer than the header deadline (the deadline is
    per request, keep-alive keeps working), then is closed after ``keep_alive_timeout_s``
    of idleness."""
    sock = connect(gateway.port)
    sockets.append(sock)
    started = time.monotonic()
    served = 0
    while time.monotonic() - started < HEADER_TIMEOUT_S + 1.0:
        sock.sendall(request_bytes())
        status, _ = read_response(sock)
        assert status == 200, f"request {served + 1} on a kept-alive connection: {status}"
        served += 1
        time.sleep(KEEP_ALIVE_S / 2)
    assert served >= 3
    assert not open_after([sock], KEEP_ALIVE_S + SLACK_S), "idle keep-alive connection kept"


def test_httpx_client_reuses_its_connection(gateway: Gateway) -> None:
    """A real client pool (what the OpenAI SDK uses) sends requests one after another on one
    connection, with pauses shorter than the keep-alive timeout."""
    ports: set[int] = set()

    def remember(response: httpx.Response) -> None:
        stream = response.extensions["network_stream"]
        ports.add(stream.get_extra_info("client_addr")[1])

    with httpx.Client(event_hooks={"response": [remember]}, timeout=10.0) as client:
        for _ in range(4):
            assert client.get(f"http://127.0.0.1:{gateway.port}/healthz").status_code == 200
            time.sleep(KEEP_ALIVE_S / 4)
    assert len(ports) == 1


# --- oversized headers and the connection cap ----------------------------------------------


@pytest.mark.parametrize("size", [1024 * 1024, 100 * 1024])
def test_oversized_header_is_refused(
    gateway: Gateway, sockets: list[socket.socket], size: int
) -> None:
    """A header block above the limit (32 KiB by default) gets 431 or a closed connection,
    never an answer; the gateway is unharmed."""
    sock = connect(gateway.port)
    sockets.append(sock)
    with suppress(BrokenPipeError, ConnectionResetError):  # refused before all was sent
        sock.sendall(request_bytes(extra=f"X-Big: {'a' * size}\r\n"))
    status, _ = read_response(sock)
    assert status in (0, 431)
    assert healthz(gateway.port) == 200


def test_header_under_the_limit_is_served(gateway: Gateway, sockets: list[socket.socket]) -> None:
    sock = connect(gateway.port)
    sockets.append(sock)
    sock.sendall(request_bytes(extra=f"X-Big: {'a' * 8192}\r\n"))
    assert read_response(sock)[0] == 200


def test_connections_over_the_cap_are_refused(
    gateway: Gateway, sockets: list[socket.socket]
) -> None:
    """With ``max_connections`` connections held open, one more gets 503 (or is closed)
    instead of being served; once the idle ones time out, /healthz answers again."""
    held = [connect(gateway.port) for _ in range(MAX_CONNECTIONS)]
    sockets.extend(held)
    extra = connect(gateway.port)
    sockets.append(extra)
    with suppress(BrokenPipeError, ConnectionResetError):
        extra.sendall(request_bytes())
    assert read_response(extra)[0] in (0, 503)
    assert not open_after(held, HEADER_TIMEOUT_S + SLACK_S)
    assert healthz(gateway.port) == 200


# --- streams: many at once, and clients that never read ------------------------------------


def stream_request(key: str, model: str) -> bytes:
    body = json.dumps(
        {
            "model": model,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def chat(port: int, key: str, model: str = "count") -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        timeout=10.0,
    )


def status_499_lines(log: str, model: str) -> int:
    count = 0
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        if event.get("event") == "request.completed" and event.get("model") == model:
            count += event.get("status") == 499
    return count


def test_clients_that_never_read_are_ended_and_free_their_slots(
    gateway: Gateway, sockets: list[socket.socket]
) -> None:
    """A tenant with ``concurrency: 4`` opens 4 endless streams and never reads them: the
    slots are full (the next request gets 429), then the send timeout ends those requests
    (499 in the log) and the tenant is served again; /healthz answers all along."""
    key = gateway.keys["stuck"]
    for _ in range(STUCK_READERS):
        sock = connect(gateway.port, rcvbuf=4096)
        sock.sendall(stream_request(key, "endless"))
        sockets.append(sock)
    deadline = time.monotonic() + 10.0
    while chat(gateway.port, key).status_code != 429:  # the streams hold every slot
        assert time.monotonic() < deadline, "the never-reading streams did not take the slots"
        time.sleep(0.05)
    assert healthz(gateway.port) == 200
    deadline = time.monotonic() + SEND_TIMEOUT_S + 15.0  # filling the socket buffers first
    while (status := chat(gateway.port, key).status_code) == 429:
        assert time.monotonic() < deadline, f"slots never freed:\n{gateway.log()}"
        time.sleep(0.25)
    assert status == 200
    deadline = time.monotonic() + 5.0
    while status_499_lines(gateway.log(), "endless") < STUCK_READERS:
        assert time.monotonic() < deadline, gateway.log()
        time.sleep(0.1)


def test_many_concurrent_streams_complete(gateway: Gateway) -> None:
    """60 streams at once from one tenant all reach [DONE], and /healthz answers meanwhile."""
    key = gateway.keys["crowd"]

    async def one(client: httpx.AsyncClient) -> bool:
        body = {"model": "count", "stream": True, "messages": [{"role": "user", "content": "q"}]}
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            text = "".join([piece async for piece in response.aiter_text()])
        return response.status_code == 200 and text.rstrip().endswith("data: [DONE]")

    async def run() -> tuple[list[bool], int]:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{gateway.port}",
            timeout=30.0,
            headers={"authorization": f"Bearer {key}"},
            limits=httpx.Limits(max_connections=60),
        ) as client:
            streams = asyncio.gather(*(one(client) for _ in range(60)))
            health = await client.get("/healthz")
            return await streams, health.status_code

    done, health = asyncio.run(run())
    assert all(done), f"{done.count(False)} of 60 streams incomplete"
    assert health == 200


@pytest.mark.parametrize("after", ["connect", "keep_alive"])
def test_a_request_sent_while_the_gateway_stalls_is_answered(
    gateway: Gateway, sockets: list[socket.socket], after: str
) -> None:
    """Deadlines measure the client, not the gateway: a request that arrives in time, while
    the gateway's loop is stalled (here: stopped) past ``header_timeout_s`` (a new
    connection) or ``keep_alive_timeout_s`` (an idle kept-alive one), is served when the
    loop runs again. Before: the expired timer ran before the socket was read, and the
    connection was closed without an answer (4 runs in 5, or every run)."""
    assert gateway.process.proc is not None
    pid = gateway.process.proc.pid
    socks = [connect(gateway.port) for _ in range(4)]
    sockets.extend(socks)
    if after == "keep_alive":
        for sock in socks:
            sock.sendall(request_bytes())
            assert read_response(sock)[0] == 200
    assert healthz(gateway.port) == 200  # the loop has run since: the connections are accepted
    time.sleep(0.3)  # an idle loop sleeps in its poll, whose wake-up the stop turns into a stall
    os.kill(pid, signal.SIGSTOP)
    try:
        for sock in socks:
            sock.sendall(request_bytes())
        time.sleep(max(HEADER_TIMEOUT_S, KEEP_ALIVE_S) + 0.5)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert [read_response(sock)[0] for sock in socks] == [200] * 4
