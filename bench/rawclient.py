"""A small HTTP/1.1 keep-alive client on raw asyncio streams, so the load generator costs
little CPU next to the server it measures. Records time to first body byte and to the end."""

from __future__ import annotations

import asyncio
import time


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def request(self, raw: bytes) -> tuple[int, float, float]:
        """Send one request; return (status, seconds to first body byte, seconds to end)."""
        start = time.perf_counter()
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        headers = head.lower()
        if b"transfer-encoding: chunked" in headers:
            first = await self._read_chunked(start)
        else:
            length = int(headers.split(b"content-length:")[1].split(b"\r\n")[0])
            await self.reader.readexactly(length)
            first = time.perf_counter() - start
        return status, first, time.perf_counter() - start

    async def _read_chunked(self, start: float) -> float:
        first = 0.0
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
            await self.reader.readexactly(size + 2)
            if size and not first:
                first = time.perf_counter() - start
            if size == 0:
                return first

    def close(self) -> None:
        self.writer.close()


def post_request(path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer bench\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body
