"""HTTP client cost per upstream call (issue: gateway core): httpx (the chosen client) next to
aiohttp and a raw asyncio keep-alive client, each sending the same JSON POST to the instant
fake upstream with 4 concurrent keep-alive connections. Prints client CPU ms per request.

Run: .venv/bin/python -m bench.http_clients [--requests 3000]   (aiohttp optional)
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time

import httpx

from bench.gateway import BODY
from bench.rawclient import Connection, post_request
from tests.fixtures.server import free_port

CONCURRENCY = 4


async def with_httpx(port: int, n: int) -> None:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with httpx.AsyncClient() as client:

        async def worker(k: int) -> None:
            for _ in range(k):
                response = await client.post(
                    url, content=BODY, headers={"content-type": "application/json"}
                )
                response.raise_for_status()

        await asyncio.gather(*(worker(n // CONCURRENCY) for _ in range(CONCURRENCY)))


async def with_aiohttp(port: int, n: int) -> None:
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with aiohttp.ClientSession() as session:

        async def worker(k: int) -> None:
            for _ in range(k):
                async with session.post(
                    url, data=BODY, headers={"content-type": "application/json"}
                ) as r:
                    r.raise_for_status()
                    await r.read()

        await asyncio.gather(*(worker(n // CONCURRENCY) for _ in range(CONCURRENCY)))


async def with_raw(port: int, n: int) -> None:
    raw = post_request("/v1/chat/completions", BODY)
    conns = [await Connection.open(port) for _ in range(CONCURRENCY)]

    async def worker(conn: Connection, k: int) -> None:
        for _ in range(k):
            await conn.request(raw)

    await asyncio.gather(*(worker(c, n // CONCURRENCY) for c in conns))
    for conn in conns:
        conn.close()


def cpu() -> float:
    return time.process_time()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    port = free_port()
    upstream = subprocess.Popen([sys.executable, "-m", "bench.fake_upstream", str(port)])
    time.sleep(0.5)
    try:
        for name, run in (
            ("httpx", with_httpx),
            ("aiohttp", with_aiohttp),
            ("raw asyncio", with_raw),
        ):
            try:
                asyncio.run(run(port, 400))  # warm-up
            except ImportError:
                print(f"{name:12s} not installed")
                continue
            start = cpu()
            asyncio.run(run(port, args.requests))
            print(f"{name:12s} {1000 * (cpu() - start) / args.requests:.3f} ms CPU per request")
    finally:
        upstream.terminate()


if __name__ == "__main__":
    main()
