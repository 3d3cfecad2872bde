"""Simulated targets: latency and price models, the local tier's capacity, outages.

Managed APIs have no capacity limit here (a vendor absorbs one gateway's load):
TTFT = (base + prefill per prompt token x prompt) x noise, time per output token =
tpot x noise, noise log-normal with median 1.

The local tier is ``slots`` sequences decoded together (continuous batching): a request
that finds no free slot waits for the earliest one to free (that wait is part of its TTFT),
and decoding slows as the batch fills (tpot x (1 + load_slope x running / slots)). It is
billed by the hour; per token it costs ``hourly_usd / (tokens_per_s x 3600)``, which is how
``core.config_tenants.Price`` prices hourly targets for the strategies too.

Default figures: prices are public list prices of a premium, a mid and a small model
(USD per million input/output tokens: 3/15, 0.40/1.60, 0.10/0.40); latencies are
assumptions of the right order for hosted APIs and one GPU serving a small model.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from bench.simulator.trace import SimRequest
from core.config_tenants import Price


@dataclass(frozen=True)
class Service:
    """One successful call: seconds to the first token and per output token, and cost."""

    ttft_s: float
    tpot_s: float
    cost_usd: float

    def total_s(self, output_tokens: int) -> float:
        return self.ttft_s + self.tpot_s * output_tokens


def request_cost(price: Price, req: SimRequest) -> float:
    """USD for the tokens ``req`` actually used at ``price``."""
    prompt, output, _cached = price.per_token()
    return prompt * req.prompt_tokens + output * req.output_tokens


@dataclass(frozen=True)
class ManagedModel:
    """A hosted API model."""

    label: str
    price: Price
    ttft_base_s: float
    prefill_s_per_token: float
    tpot_s: float
    noise_sigma: float
    max_context: int = 200_000

    def serve(self, at_s: float, req: SimRequest, rng: random.Random) -> Service:
        base = self.ttft_base_s + self.prefill_s_per_token * req.prompt_tokens
        ttft = base * rng.lognormvariate(0.0, self.noise_sigma)
        tpot = self.tpot_s * rng.lognormvariate(0.0, self.noise_sigma / 2)
        return Service(ttft, tpot, request_cost(self.price, req))


@dataclass
class LocalTier:
    """The team's own GPU: ``slots`` concurrent sequences, billed ``hourly_usd``."""

    label: str
    hourly_usd: float
    tokens_per_s: float
    slots: int
    ttft_base_s: float
    prefill_s_per_token: float
    tpot_s: float
    load_slope: float
    noise_sigma: float
    max_context: int = 8192
    _slots: list[float] = field(default_factory=list)  # heap: when each taken slot frees
    _ends: list[float] = field(default_factory=list)  # heap: admitted requests' end times
    _starts: list[float] = field(default_factory=list)  # heap: queued requests' start times

    @property
    def price(self) -> Price:
        return Price(hourly_usd=self.hourly_usd, tokens_per_s=self.tokens_per_s)

    def load(self, now_s: float) -> tuple[int, int]:
        """(running, waiting) at ``now_s``: sequences decoding and requests still queued."""
        for heap in (self._ends, self._starts):
            while heap and heap[0] <= now_s:
                heapq.heappop(heap)
        waiting = len(self._starts)
        return len(self._ends) - waiting, waiting

    def saturated(self, now_s: float) -> bool:
        """True when a request arriving now would have to queue."""
        running, waiting = self.load(now_s)
        return waiting > 0 or running >= self.slots

    def serve(self, at_s: float, req: SimRequest, rng: random.Random) -> Service:
        """Admit ``req`` at ``at_s``, queueing for the slot that frees first if none is free."""
        while self._slots and self._slots[0] <= at_s:
            heapq.heappop(self._slots)
        running, _ = self.load(at_s)
        start = at_s
        if len(self._slots) >= self.slots:
            start = heapq.heappop(self._slots)
            running = self.slots - 1  # when our slot frees, every other one is still busy
        factor = 1.0 + self.load_slope * min(running + 1, self.slots) / self.slots
        noise = rng.lognormvariate(0.0, self.noise_sigma)
        prefill = (self.ttft_base_s + self.prefill_s_per_token * req.prompt_tokens) * factor
        tpot = self.tpot_s * factor * noise
        ttft = (start - at_s) + prefill * noise
        end = at_s + ttft + tpot * req.output_tokens
        heapq.heappush(self._slots, end)
        heapq.heappush(self._ends, end)
        if start > at_s:
            heapq.heappush(self._starts, start)
        return Service(ttft, tpot, request_cost(self.price, req))


SimTarget = ManagedModel | LocalTier


@dataclass(frozen=True)
class Outage:
    """``label`` answers every call with a 5xx after ``fail_after_s`` during
    ``[start_s, end_s)``."""

    label: str
    start_s: float
    end_s: float
    fail_after_s: float = 0.3

    def down(self, label: str, at_s: float) -> bool:
        return label == self.label and self.start_s <= at_s < self.end_s


def default_targets() -> list[SimTarget]:
    """premium, mid and cheap hosted models and one local GPU (see the module docstring)."""
    return [
        LocalTier(
            "local/small",
            hourly_usd=2.5,
            tokens_per_s=2500.0,
            slots=16,
            ttft_base_s=0.08,
            prefill_s_per_token=0.0001,
            tpot_s=0.02,
            load_slope=1.0,
            noise_sigma=0.15,
        ),
        ManagedModel(
            "vendor/cheap",
            Price(input_per_mtok=0.10, output_per_mtok=0.40),
            ttft_base_s=0.8,
            prefill_s_per_token=0.00006,
            tpot_s=0.008,
            noise_sigma=0.5,
        ),
        ManagedModel(
            "vendor/mid",
            Price(input_per_mtok=0.40, output_per_mtok=1.60),
            ttft_base_s=0.35,
            prefill_s_per_token=0.00004,
            tpot_s=0.012,
            noise_sigma=0.35,
        ),
        ManagedModel(
            "vendor/premium",
            Price(input_per_mtok=3.0, output_per_mtok=15.0),
            ttft_base_s=0.45,
            prefill_s_per_token=0.00003,
            tpot_s=0.02,
            noise_sigma=0.35,
        ),
    ]
