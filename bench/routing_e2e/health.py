"""The gateway's view of its targets over a run: ``GET /admin/targets`` polled once a second.

Contract: ``watch`` appends one ``HealthSample`` per target and poll to ``out`` until it is
cancelled; ``at_s`` counts from the trace start (negative: before the first arrival). A poll
that fails (the gateway busy or gone) is skipped, never raised: the timeline explains a
run, it is not part of its figures. The gateway must have been started with the admin key
``ADMIN_KEY`` in ``ADMIN_KEY_ENV`` (``gateway.gateway_config`` and ``Gateway.spawn`` do).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import httpx

ADMIN_KEY_ENV = "ROUTING_E2E_ADMIN_KEY"
ADMIN_KEY = "routing-e2e-admin"  # loopback only, for the benchmark's own gateways
# What the strategies read (core.routing.TargetHealth), kept for each poll.
FIELDS = (
    "ttft_s",
    "ttft_base_s",
    "ttft_per_token_s",
    "ttft_spread",
    "ttft_band_spreads",
    "ttft_load_factor",
    "ttft_load_knee",
    "ttft_penalty",
    "ttft_penalty_from_tokens",
    "ttft_penalty_from_in_flight",
    "ttft_age_s",
    "ttft_band_ages_s",
    "ttft_steady_base_s",
    "ttft_steady_per_token_s",
    "ttft_steady_band_spreads",
    "in_flight",
    "breaker",
)


@dataclass(frozen=True, slots=True)
class HealthSample:
    at_s: float
    target: str
    health: dict[str, Any]


def samples_of(body: dict[str, Any], at_s: float) -> list[HealthSample]:
    """The ``FIELDS`` of each target in one ``/admin/targets`` body."""
    return [
        HealthSample(at_s, str(t["target"]), {k: t.get(k) for k in FIELDS})
        for t in body.get("targets", [])
    ]


async def watch(url: str, start: float, out: list[HealthSample], every_s: float = 1.0) -> None:
    """Poll ``url``'s ``/admin/targets`` every ``every_s`` (loop time ``start`` = trace 0)."""
    loop = asyncio.get_running_loop()
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=every_s) as client:
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                response = await client.get("/admin/targets")
                if response.status_code == 200:
                    out += samples_of(response.json(), round(loop.time() - start, 2))
            await asyncio.sleep(every_s)
