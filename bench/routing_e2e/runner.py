"""Run the policies of one (seed, feed) side by side: each policy gets its own four fake
upstreams and its own gateway process, and all replay the same trace from the same start.

Contract: ``run_group`` returns one ``PolicyRun`` per policy; it always stops what it
started (gateways by SIGTERM then SIGKILL, upstreams closed) and is bounded by the trace
span plus ``client_timeout_s`` plus start-up. Times are scaled by ``Settings.scale``
(upstream latencies and the outage; arrivals keep ``rate``).
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bench.routing_e2e.client import Outcome, replay
from bench.routing_e2e.gateway import ALIAS, Gateway, gateway_config, to_yaml
from bench.routing_e2e.health import HealthSample, watch
from bench.routing_e2e.menu import MENU, ORDER
from bench.routing_e2e.upstream import FakeUpstream, UpstreamStats
from bench.routing_e2e.workload import TraceRequest, make_trace, span_s

POLICIES = ("priority", "slo", "slo_hedged", "lowest_cost", "least_latency", "weighted")
START_UP_S = 20.0  # gateway start-up allowance in duration estimates
GATEWAY_FIRST_TOKEN_S = 60.0  # the gateway's default first_token_timeout_s (hangs end there)


@dataclass(frozen=True)
class Settings:
    seeds: tuple[int, ...] = (1, 2, 3)
    requests: int = 600
    rate: float = 6.0
    feeds: tuple[str, ...] = ("none", "metrics")
    policies: tuple[str, ...] = POLICIES
    outage_upstream: str = "mid"
    outage_s: float = 20.0
    outage_at: float = 0.4  # share of the trace span where the outage starts
    scale: float = 1.0
    client_timeout_s: float = 150.0
    parallel: int = 5  # policies side by side (fewer: less CPU contention, longer runs)
    workdir: Path | None = None  # gateway configs and logs; a temporary folder if None

    @property
    def batches(self) -> int:
        step = max(1, self.parallel)
        return (len(self.policies) + step - 1) // step

    def bound_s(self) -> float:
        """The longest one (seed, feed) group can take."""
        one = START_UP_S + self.requests / self.rate * 1.3 + self.client_timeout_s
        return one * self.batches

    def typical_s(self) -> float:
        """Expected length of one group: start-up, the span, then the outage's hangs time
        out at the gateway's default first-token timeout (60 s) after the window."""
        span = self.requests / self.rate
        hang_tail = self.outage_at * span + self.outage_s * self.scale + GATEWAY_FIRST_TOKEN_S
        one = START_UP_S + max(span, hang_tail if self.outage_s > 0 else 0.0) + 5.0
        return one * self.batches


@dataclass
class PolicyRun:
    seed: int
    feed: str
    policy: str
    trace: list[TraceRequest]
    outcomes: list[Outcome]
    upstreams: dict[str, UpstreamStats]
    span_s: float
    outage: tuple[float, float]  # seconds after the trace start
    config: dict[str, object] = field(default_factory=dict)
    loop_lag_s: dict[str, float] = field(default_factory=dict)
    health: list[HealthSample] = field(default_factory=list)  # the gateway's view, 1/s


async def _watch_lag(samples: list[float], every: float = 0.05) -> None:
    """Record how late the harness's event loop wakes up (TTFT measurement error)."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + every
        await asyncio.sleep(every)
        samples.append(max(0.0, loop.time() - due))


def _lag_summary(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    ordered = sorted(samples)
    return {"p99": ordered[int(0.99 * (len(ordered) - 1))], "max": ordered[-1]}


async def _start_upstreams(seed: int, scale: float) -> dict[str, FakeUpstream]:
    ups = {name: FakeUpstream(MENU[name], seed, scale) for name in ORDER}
    for up in ups.values():
        await up.start()
    return ups


async def run_group(seed: int, feed: str, settings: Settings) -> list[PolicyRun]:
    """Replay the seed's trace through every policy (``feed``: none or metrics), at most
    ``settings.parallel`` policies side by side, batch after batch."""
    runs: list[PolicyRun] = []
    step = max(1, settings.parallel)
    for i in range(0, len(settings.policies), step):
        runs += await _run_batch(seed, feed, settings, settings.policies[i : i + step])
    return runs


async def _run_batch(
    seed: int, feed: str, settings: Settings, policies: tuple[str, ...]
) -> list[PolicyRun]:
    """The policies of one batch side by side, each with its own gateway and upstreams."""
    trace = make_trace(seed, settings.requests, settings.rate)
    span = span_s(trace)
    with tempfile.TemporaryDirectory(prefix="routing_e2e_") as tmp:
        work = settings.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        sets = {p: await _start_upstreams(seed, settings.scale) for p in policies}
        gateways: dict[str, Gateway] = {}
        configs: dict[str, dict[str, object]] = {}
        try:
            for policy, ups in sets.items():
                urls = {name: up.url for name, up in ups.items()}
                stem = work / f"s{seed}-{feed}-{policy}"
                configs[policy] = gateway_config(policy, urls, feed, stem.with_suffix(".sqlite3"))
                stem.with_suffix(".yaml").write_text(to_yaml(configs[policy]))
                gateways[policy] = Gateway(stem.with_suffix(".yaml"), stem.with_suffix(".log"))
                gateways[policy].spawn()
            await asyncio.gather(*(asyncio.to_thread(g.wait_ready) for g in gateways.values()))
            loop = asyncio.get_running_loop()
            start = loop.time() + 0.5
            off = settings.outage_at * span
            window = (off, off + settings.outage_s * settings.scale)
            for ups in sets.values():
                ups[settings.outage_upstream].set_outage(start + window[0], start + window[1])
            lags: list[float] = []
            health: dict[str, list[HealthSample]] = {p: [] for p in policies}
            watchers = [asyncio.create_task(_watch_lag(lags))] + [
                asyncio.create_task(watch(gateways[p].url, start, health[p])) for p in policies
            ]
            results = await asyncio.gather(
                *(
                    replay(gateways[p].url, trace, start, ALIAS, settings.client_timeout_s)
                    for p in policies
                )
            )
            for watcher in watchers:
                watcher.cancel()
        finally:
            await asyncio.gather(*(asyncio.to_thread(g.stop) for g in gateways.values()))
            for ups in sets.values():
                for up in ups.values():
                    await up.stop()
    return [
        PolicyRun(
            seed,
            feed,
            policy,
            trace,
            outcomes,
            {n: u.stats for n, u in sets[policy].items()},
            span,
            window,
            configs[policy],
            _lag_summary(lags),
            health[policy],
        )
        for policy, outcomes in zip(policies, results, strict=True)
    ]
