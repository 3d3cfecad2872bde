"""The routing simulator's pieces (bench/simulator): trace, target models, the health board
the real strategies read, fallback on outages, and cost accounting. Not the headline figure:
bench/ prints that, tests never assert it."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import msgspec
import pytest

from bench.simulator.__main__ import main
from bench.simulator.engine import Simulation
from bench.simulator.health import HealthBoard
from bench.simulator.policies import POLICIES, Policy, run_policy
from bench.simulator.report import summarise
from bench.simulator.targets import (
    LocalTier,
    ManagedModel,
    Outage,
    default_targets,
    request_cost,
)
from bench.simulator.trace import MIXED, SimRequest, make_trace
from core.clock import FakeClock
from core.config_routing import PriorityStrategy, SloStrategy
from core.config_tenants import Price
from policies.latency import LatencyStats
from routers.strategies import build_strategy
from routers.strategies.deadlines import Deadline, Hedge


def managed(
    label: str, ttft: float, price: float = 1.0, sigma: float = 0.0, prefill: float = 0.0
) -> ManagedModel:
    return ManagedModel(
        label,
        Price(input_per_mtok=price, output_per_mtok=price * 4),
        ttft_base_s=ttft,
        prefill_s_per_token=prefill,
        tpot_s=0.01,
        noise_sigma=sigma,
    )


def local(slots: int = 2) -> LocalTier:
    return LocalTier(
        "local/gpu",
        hourly_usd=3.6,
        tokens_per_s=1000.0,
        slots=slots,
        ttft_base_s=0.1,
        prefill_s_per_token=0.0,
        tpot_s=0.01,
        load_slope=0.0,
        noise_sigma=0.0,
        max_context=4096,
    )


def req(
    index: int, at: float, prompt: int = 100, output: int = 50, slo_ms: float = 1000.0
) -> SimRequest:
    return SimRequest(index, at, "chat", prompt, output, 256, slo_ms)


# ---------------------------------------------------------------- trace
def test_trace_is_deterministic_per_seed_and_poisson_ish() -> None:
    a, b = make_trace(4000, 5.0, seed=3), make_trace(4000, 5.0, seed=3)
    assert a == b
    assert a != make_trace(4000, 5.0, seed=4)
    arrivals = [r.arrival_s for r in a]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0
    assert 4000 / arrivals[-1] == pytest.approx(5.0, rel=0.05)
    shares = Counter(r.klass for r in a)
    for klass in MIXED:
        assert shares[klass.name] / 4000 == pytest.approx(klass.share, abs=0.03)
        mine = [r for r in a if r.klass == klass.name]
        assert all(
            r.output_tokens <= klass.max_tokens and r.slo_ttft_ms == klass.slo_ttft_ms for r in mine
        )


# ---------------------------------------------------------------- target models
def test_local_tier_queues_when_its_slots_are_full() -> None:
    gpu = local(slots=1)
    rng = random.Random(0)
    first = gpu.serve(0.0, req(0, 0.0), rng)  # 0.1 s + 50 x 0.01 s: busy until 0.6
    assert first.ttft_s == pytest.approx(0.1)
    assert gpu.saturated(0.2) and gpu.load(0.2) == (1, 0)
    second = gpu.serve(0.2, req(1, 0.2), rng)
    assert second.ttft_s == pytest.approx(0.4 + 0.1)  # waited for the slot, then prefill
    assert gpu.load(0.3) == (1, 1)
    assert gpu.load(0.7) == (1, 0) and not gpu.saturated(1.2)


def test_local_tier_is_priced_per_token_from_its_hourly_price() -> None:
    gpu = local()
    # $3.60/h over 1,000 tokens/s = $1 per million tokens, input and output alike.
    assert request_cost(gpu.price, req(0, 0.0, prompt=600, output=400)) == pytest.approx(1e-3)
    assert request_cost(
        Price(input_per_mtok=2.0, output_per_mtok=10.0), req(0, 0.0, prompt=1000, output=100)
    ) == pytest.approx(0.003)


# ---------------------------------------------------------------- health board
def test_board_learns_only_what_has_happened_by_now() -> None:
    board = HealthBoard(["a/x"], lambda label, now: None)
    sent = board.started("a/x", 0.0)
    board.succeeded("a/x", sent, ttft_s=2.0, tpot_s=0.05, end_s=7.0)
    board.advance(1.0)
    assert board.health("a/x").ttft_s is None and board.health("a/x").in_flight == 1
    board.advance(2.0)
    assert board.health("a/x").ttft_s == 2.0 and board.health("a/x").tpot_s is None
    board.advance(7.0)
    assert board.health("a/x").tpot_s == 0.05 and board.health("a/x").in_flight == 0


def test_board_feeds_the_gateways_latency_stats_what_the_gateway_would() -> None:
    """The board's latency fields are exactly those of a ``LatencyStats`` built as the
    gateway builds it and fed the same samples at the same (simulated) times."""
    board = HealthBoard(["a/x"], lambda label, now: None)
    clock = FakeClock(start=0.0)
    reference = LatencyStats(clock)
    # The third overlaps the second: its band of in-flight counts is new, so it teaches
    # the load curve only (``policies.latency``), in both.
    samples = [(0.0, 1.0, 2000, 0.02, 100), (4.0, 2.5, 30_000, 0.03, 50), (5.0, 0.8, 500, 0.01, 10)]
    loads = []
    for start, ttft, prompt, tpot, output in samples:
        board.advance(start)
        sent = board.started("a/x", start, prompt)
        loads.append(sent.load)
        end = start + ttft + tpot * output
        board.succeeded("a/x", sent, ttft, tpot, end, prompt, output)
    assert loads == [0, 0, 1]
    events = sorted(
        [(s + t, "ttft", t, p, load) for (s, t, p, _, _), load in zip(samples, loads, strict=True)]
        + [(s + t + tp * o, "done", tp * o, o, None) for s, t, _, tp, o in samples]
    )
    for at, kind, value, n, load in events:
        clock.advance(at - clock.now())
        if kind == "ttft":
            reference.observe_ttft("a/x", value, n, load)
        else:
            reference.observe_tokens("a/x", n, value)
    board.advance(clock.now())
    health = board.health("a/x")
    assert health.ttft_base_s is not None and health.ttft_per_token_s > 0
    assert health.ttft_spread is not None and health.in_flight == 0
    assert msgspec.structs.replace(health, breaker="closed") == reference.health("a/x")
    board.advance(clock.now() + 301)  # the gateway's default max age: the fast fit is gone
    stale = board.health("a/x")
    assert stale.ttft_s is None and stale.ttft_base_s is not None  # the slow fit remains
    board.advance(clock.now() + 3601)  # and the slow one: unmeasured again
    assert board.health("a/x").ttft_base_s is None


def test_board_breaker_opens_half_opens_and_closes() -> None:
    board = HealthBoard(["a/x"], lambda label, now: None, trip_after=3, cooldown_s=10.0)
    for i in range(3):
        board.failed("a/x", board.started("a/x", float(i)), float(i))
    board.advance(1.5)
    assert board.breaker("a/x") == "closed"  # two failures so far
    board.advance(2.0)
    assert board.breaker("a/x") == "open"
    board.advance(12.0)
    assert board.breaker("a/x") == "half_open"
    board.failed("a/x", board.started("a/x", 12.5), 12.5)  # the probe fails: open again
    board.advance(13.0)
    assert board.breaker("a/x") == "open"
    board.succeeded("a/x", board.started("a/x", 23.0), 0.5, 0.01, 24.0)
    board.advance(23.5)
    assert board.breaker("a/x") == "closed"


# ---------------------------------------------------------------- engine
def test_failing_targets_requests_fall_back_and_the_breaker_stops_the_waste() -> None:
    targets = [managed("v/premium", 0.5), managed("v/mid", 0.3)]
    trace = [req(i, i * 0.5) for i in range(200)]  # 100 s
    outage = Outage("v/premium", 10.0, 60.0, fail_after_s=0.3)
    sim = Simulation(targets, build_strategy(PriorityStrategy()), [outage], seed=1)
    outcomes = sim.run(trace)
    assert all(o.served_by is not None for o in outcomes)
    during = [o for o in outcomes if 10.0 <= o.request.arrival_s < 60.0]
    assert all(o.served_by == "v/mid" for o in during)
    wasted = [o for o in during if o.failed_attempts]
    # 5 failures trip the breaker; afterwards one half-open probe per 15 s cool-down.
    assert 5 <= len(wasted) <= 5 + 50 // 15 + 1
    assert all(o.ttft_s == pytest.approx(0.3 + 0.3) for o in wasted)
    assert all(o.served_by == "v/premium" for o in outcomes if o.request.arrival_s < 10.0)
    assert outcomes[-1].served_by == "v/premium"  # recovered after the outage


def test_without_a_fallback_the_outage_fails_requests() -> None:
    sim = Simulation(
        [managed("v/only", 0.5)],
        build_strategy(PriorityStrategy()),
        [Outage("v/only", 0.0, 5.0)],
        seed=1,
    )
    outcomes = sim.run([req(i, 1.0 + i) for i in range(10)])
    failed = [o for o in outcomes if o.served_by is None]
    assert failed and all(not o.met_slo and o.cost_usd == 0.0 for o in failed)
    assert all(o.served_by == "v/only" for o in outcomes if o.request.arrival_s >= 5.0)


def test_saturated_local_tier_spills_and_long_prompts_never_go_local() -> None:
    targets = [local(slots=1), managed("v/api", 0.4)]
    trace = [req(0, 0.0), req(1, 0.01), req(2, 0.02, prompt=5000)]
    outcomes = Simulation(targets, build_strategy(PriorityStrategy()), seed=1).run(trace)
    assert [o.served_by for o in outcomes] == ["local/gpu", "v/api", "v/api"]


def test_slo_strategy_moves_off_a_target_measured_too_slow() -> None:
    targets = [managed("v/cheap-slow", 2.0, price=0.1), managed("v/fast", 0.3, price=5.0)]
    trace = [req(i, i * 1.0, slo_ms=1000.0) for i in range(60)]
    outcomes = Simulation(targets, build_strategy(SloStrategy()), seed=1).run(trace)
    served = [o.served_by for o in outcomes]
    # Cheapest, unmeasured: tried first, and cut at the 1 s objective (the fast target is
    # unmeasured, so it reserves nothing); the fast one serves.
    assert outcomes[0].failed_attempts == ("v/cheap-slow",) and served[0] == "v/fast"
    assert set(served[1:]) == {"v/fast"}  # once measured at >= 1 s, avoided (probes are cut)
    probes = [o for o in outcomes if o.failed_attempts]
    # Later tries are recovery probes (penalised, holding nothing, its last cut at least
    # ``recover_after_s`` old: ``slo._recovering``), one at a time, cut in time for the
    # fast target's p99 (noise-free as it is, wide at first: its spread starts at a prior),
    # so the request still meets its objective.
    recover_s = SloStrategy().recover_after_s
    assert 1 < len(probes) <= 60 / recover_s + 1
    gaps = [b.request.arrival_s - a.request.arrival_s for a, b in itertools.pairwise(probes)]
    assert all(gap >= recover_s for gap in gaps)
    assert all(0.5 <= o.ttft_s <= 1.0 + 1e-9 for o in probes[1:])


def test_slo_strategy_sends_long_prompts_where_they_meet_the_objective() -> None:
    """A cheap model that starts short prompts in time but needs ~4.8 s for a 40k-token
    one, and a dear one that never does: once both are measured, the long prompts go dear
    and the short ones cheap. A mean over both lengths (~2.9 s) would call the cheap model
    good for everything, and every long prompt sent there would miss."""
    targets = [
        managed("v/cheap", 0.8, price=0.1, prefill=1e-4),
        managed("v/dear", 0.4, price=5.0, prefill=2e-5),
    ]
    trace = [req(i, i * 2.0, prompt=40_000 if i % 2 else 2000, slo_ms=4000.0) for i in range(80)]
    outcomes = Simulation(targets, build_strategy(SloStrategy()), seed=1).run(trace)
    later = outcomes[20:]
    assert {o.served_by for o in later if o.request.prompt_tokens == 2000} == {"v/cheap"}
    assert {o.served_by for o in later if o.request.prompt_tokens == 40_000} == {"v/dear"}
    # Penalised for long prompts, the cheap model is probed with one again at most once
    # per ``recover_after_s`` after its last cut (``slo._recovering``), and cut in time
    # for the dear one to answer by the objective (noise-free here: exactly at it).
    retried = [o for o in later if o.failed_attempts]
    span_s = later[-1].request.arrival_s - later[0].request.arrival_s
    recover_s = SloStrategy().recover_after_s
    assert 1 <= len(retried) <= span_s / recover_s + 1
    gaps = [b.request.arrival_s - a.request.arrival_s for a, b in itertools.pairwise(retried)]
    assert all(gap >= recover_s for gap in gaps)
    assert all(o.ttft_s <= 4.0 + 1e-9 for o in later)


# ---------------------------------------------------------------- accounting and report
def test_cost_accounting_is_the_sum_of_per_request_costs() -> None:
    targets = default_targets()
    trace = make_trace(600, 4.0, seed=2)
    policy = next(p for p in POLICIES if p.name == "slo")
    sim = Simulation(targets, build_strategy(policy.strategy), seed=2)
    outcomes = sim.run(trace)
    prices = {t.label: t.price for t in targets}
    by_hand = sum(request_cost(prices[o.served_by], o.request) for o in outcomes if o.served_by)
    summary = summarise("slo", outcomes, {"local/small"}, fixed_usd=1.25)
    assert summary.cost_usd == pytest.approx(by_hand)
    hosted = sum(o.cost_usd for o in outcomes if o.served_by not in (None, "local/small"))
    assert summary.billed_usd == pytest.approx(hosted + 1.25)
    assert summary.slo_met == sum(o.met_slo for o in outcomes)
    assert sum(summary.served.values()) == summary.requests == 600
    assert sum(n for _, n in summary.per_class.values()) == 600


def test_runs_are_deterministic_for_a_seed() -> None:
    trace = make_trace(500, 4.0, seed=5)
    outage = [Outage("vendor/mid", 30.0, 60.0)]
    policy = Policy("least_latency", POLICIES[4].strategy)  # uses the injected rng
    first = run_policy(policy, default_targets(), trace, outage, seed=5)
    assert run_policy(policy, default_targets(), trace, outage, seed=5) == first


def test_the_command_prints_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--requests", "400", "--seed", "1"])
    out = capsys.readouterr().out
    for policy in POLICIES:
        assert f"\n{policy.name} " in out
    assert "slo vs always-premium:" in out


def test_a_hedged_first_target_races_the_next_from_the_hedge_moment() -> None:
    """As ``routers.hedge.race``: the first to answer serves; without the hedge the first
    target is cut at that moment; a backup in an outage is refused, so the cut stands."""
    slow = managed("v/slow", 1.0)

    def walk(backup_ttft: float, hedge: Hedge | None, outages: list[Outage] | None = None):
        targets = [slow, managed("v/backup", backup_ttft)]
        sim = Simulation(targets, build_strategy(PriorityStrategy()), outages or [], seed=1)
        deadline = {"v/slow": Deadline(0.6, hedge=hedge)}
        return sim._walk(req(0, 0.0), sim.targets, deadline)

    race = Hedge(None, None)
    kept = walk(0.5, race)  # slow answers at 1.0, the backup would at 1.1
    assert (kept.served_by, kept.failed_attempts) == ("v/slow", ())
    assert kept.ttft_s == pytest.approx(1.0)
    rescued = walk(0.2, race)  # the backup answers at 0.8
    assert (rescued.served_by, rescued.failed_attempts) == ("v/backup", ("v/slow",))
    assert rescued.ttft_s == pytest.approx(0.8)
    cut = walk(0.5, None)  # cut at 0.6: the late answer is lost
    assert (cut.served_by, cut.failed_attempts) == ("v/backup", ("v/slow",))
    assert cut.ttft_s == pytest.approx(1.1)
    refused = walk(0.5, race, [Outage("v/backup", 0.0, 10.0, fail_after_s=0.1)])
    assert (refused.served_by, refused.failed_attempts) == (None, ("v/slow", "v/backup"))
    early = walk(0.5, Hedge(0.3, None))  # hedged at 0.3, before the cut: answers at 0.8
    assert (early.served_by, early.ttft_s) == ("v/backup", pytest.approx(0.8))
