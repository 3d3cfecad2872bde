"""An OpenAI-compatible upstream that answers at once, for load tests: raw asyncio, HTTP/1.1
keep-alive, a fixed chat completion (or a short SSE stream when the body asks for one).

Run: python -m bench.fake_upstream PORT
"""

from __future__ import annotations

import asyncio
import json
import sys

_COMPLETION = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "bench-model",
        "system_fingerprint": "fp_bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello there! " * 8},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 20, "completion_tokens": 24, "total_tokens": 44},
    }
).encode()


def _sse_body() -> bytes:
    def chunk(delta: dict, finish: str | None = None, usage: dict | None = None) -> bytes:
        payload = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "bench-model",
            "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if usage:
            payload["usage"] = usage
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    parts = [chunk({"role": "assistant", "content": ""})]
    parts += [chunk({"content": "Hello "}) for _ in range(8)]
    parts.append(chunk({}, "stop"))
    parts.append(chunk({}, usage={"prompt_tokens": 20, "completion_tokens": 8, "total_tokens": 28}))
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


_JSON_RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
    + str(len(_COMPLETION)).encode()
    + b"\r\n\r\n"
    + _COMPLETION
)
_SSE = _sse_body()
_SSE_RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: "
    + str(len(_SSE)).encode()
    + b"\r\n\r\n"
    + _SSE
)


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length) if length else b""
            writer.write(_SSE_RESPONSE if b'"stream":true' in body else _JSON_RESPONSE)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(int(sys.argv[1])))
