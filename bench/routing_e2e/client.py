"""The replay client: sends a trace to one gateway at the trace's arrival times and
measures each request at the client.

Contract: ``replay`` returns one ``Outcome`` per request, in trace order. TTFT is the time
from sending the request to the first chunk with non-empty ``delta.content``; an error is a
non-200 status, a transport failure or timeout, a stream that carries an ``error`` event
or ends without ``[DONE]``, or no content at all. ``usage`` is the usage chunk the client
received (for the consistency check against the upstreams' records).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.routing_e2e.workload import TraceRequest

SLO_HEADER = "x-switchyard-slo-ttft-ms"


@dataclass(slots=True)
class Outcome:
    index: int
    status: int = 0
    ttft_s: float | None = None
    total_s: float | None = None
    error: str | None = None
    provider: str | None = None
    reason: str | None = None
    attempts: int | None = None
    usage: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200 and self.ttft_s is not None


async def _read_stream(response: httpx.Response, out: Outcome, sent: float) -> None:
    done = False
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        if out.ttft_s is not None and '"usage"' not in data and '"error"' not in data:
            continue  # after the first token only usage and errors matter (low CPU)
        event: dict[str, Any] = json.loads(data)
        if "error" in event:
            out.error = f"stream error: {event['error'].get('message', '')[:200]}"
            return
        if event.get("usage"):
            out.usage = event["usage"]
        for choice in event.get("choices") or []:
            if out.ttft_s is None and (choice.get("delta") or {}).get("content"):
                out.ttft_s = time.monotonic() - sent
    if not done:
        out.error = "stream ended without [DONE]"
    elif out.ttft_s is None:
        out.error = "no content"


async def send_one(
    client: httpx.AsyncClient, url: str, req: TraceRequest, model: str, timeout_s: float
) -> Outcome:
    """Send ``req`` now; never raises (failures land in ``Outcome.error``)."""
    out = Outcome(req.index)
    headers = {} if req.slo_ttft_ms is None else {SLO_HEADER: f"{req.slo_ttft_ms:g}"}
    sent = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            request = client.build_request(
                "POST", url + "/v1/chat/completions", json=req.body(model), headers=headers
            )
            response = await client.send(request, stream=True)
            try:
                out.status = response.status_code
                out.provider = response.headers.get("x-switchyard-provider")
                out.reason = response.headers.get("x-switchyard-route-reason")
                attempts = response.headers.get("x-switchyard-attempts")
                out.attempts = int(attempts) if attempts else None
                if response.status_code != 200:
                    body = (await response.aread())[:300].decode("utf-8", "replace")
                    out.error = f"http {response.status_code}: {body}"
                else:
                    await _read_stream(response, out, sent)
            finally:
                await response.aclose()
    except TimeoutError:
        out.error = f"client timeout after {timeout_s:g}s"
    except httpx.HTTPError as exc:
        out.error = f"transport: {exc!r}"[:300]
    out.total_s = time.monotonic() - sent
    return out


async def replay(
    url: str, trace: list[TraceRequest], start: float, model: str, timeout_s: float
) -> list[Outcome]:
    """Send every request at ``start + at_s`` (``loop.time()``) and wait for all answers."""
    loop = asyncio.get_running_loop()
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s)) as client:

        async def at_time(req: TraceRequest) -> Outcome:
            await asyncio.sleep(max(0.0, start + req.at_s - loop.time()))
            return await send_one(client, url, req, model, timeout_s)

        return list(await asyncio.gather(*(at_time(r) for r in trace)))
