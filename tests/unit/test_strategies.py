"""Routing strategies: each ordering rule, its reasons, and the permutation invariant."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.config_routing import (
    LeastLatencyStrategy,
    LowestCostStrategy,
    PrefixAwareStrategy,
    PriorityStrategy,
    RoundRobinStrategy,
    SloStrategy,
    WeightedStrategy,
)
from core.config_tenants import Price
from core.protocols import Capabilities, Timeouts
from core.routing import UNKNOWN, RouteRequest, TargetHealth
from routers.strategies import (
    LeastLatency,
    LowestCost,
    PrefixAware,
    Priority,
    RoundRobin,
    Slo,
    Weighted,
    build_strategy,
)
from routers.strategies.predict import (
    P90_Z,
    cost_usd,
    fmt_s,
    fmt_usd,
    total_s,
    ttft_s,
    ttft_tail_s,
)


class Provider:
    capabilities = Capabilities()

    def __init__(self, name):
        self.name = name


def target(name, weight=1.0, price=None, local=False):
    from routers.targets import Target

    return Target(
        alias="a",
        provider_name=name,
        model="m",
        provider=Provider(name),
        timeouts=Timeouts(),
        weight=weight,
        price=price,
        local=local,
    )


class Health:
    def __init__(self, **by_name):
        self.by_label = {f"{name}/m": h for name, h in by_name.items()}

    def health(self, label):
        return self.by_label.get(label, UNKNOWN)


REQ = RouteRequest(model="a", prompt_tokens=1000, max_tokens=100)


def names(ranked):
    return [r.target.provider_name for r in ranked]


def per_mtok(inp, out):
    return Price(input_per_mtok=inp, output_per_mtok=out)


CONFIGS = [
    PriorityStrategy(),
    WeightedStrategy(),
    LeastLatencyStrategy(),
    LowestCostStrategy(),
    SloStrategy(),
    PrefixAwareStrategy(),
    RoundRobinStrategy(),
]


def test_build_strategy_makes_one_fresh_instance_per_config_kind():
    built = [build_strategy(c) for c in CONFIGS]
    assert [type(s) for s in built] == [
        Priority,
        Weighted,
        LeastLatency,
        LowestCost,
        Slo,
        PrefixAware,
        RoundRobin,
    ]
    assert [s.name for s in built] == [
        "priority",
        "weighted",
        "least_latency",
        "lowest_cost",
        "slo",
        "prefix_aware",
        "round_robin",
    ]
    assert build_strategy(RoundRobinStrategy()) is not build_strategy(RoundRobinStrategy())
    assert build_strategy(PrefixAwareStrategy(w_prefix=7.0)).config.w_prefix == 7.0
    with pytest.raises(TypeError):
        build_strategy(object())


healths = st.builds(
    TargetHealth,
    ttft_s=st.none() | st.floats(0, 10),
    ttft_base_s=st.none() | st.floats(0, 5),
    ttft_per_token_s=st.none() | st.floats(0, 1e-3),
    ttft_spread=st.none() | st.floats(0, 1e6),
    tpot_s=st.none() | st.floats(0, 0.1),
    waiting=st.integers(0, 20),
    kv_usage=st.floats(0, 1),
    in_flight=st.integers(0, 50),
    prefix_blocks=st.integers(0, 10),
)
target_specs = st.lists(
    st.tuples(st.floats(0, 5), st.none() | st.floats(0, 20), st.booleans(), healths),
    max_size=7,
)
requests = st.builds(
    RouteRequest,
    model=st.just("a"),
    prompt_tokens=st.integers(0, 10_000),
    max_tokens=st.none() | st.integers(1, 4000),
    slo_ttft_ms=st.none() | st.floats(1, 5000),
    slo_total_ms=st.none() | st.floats(1, 50_000),
    prefix_hashes=st.lists(st.integers(), max_size=8).map(tuple),
)


@given(st.sampled_from(CONFIGS), target_specs, requests, st.integers(0, 2**32))
def test_every_strategy_returns_a_permutation_with_reasons(config, specs, req, seed):
    candidates = [
        target(f"t{i}", weight=w, price=None if p is None else per_mtok(p, 2 * p), local=local)
        for i, (w, p, local, _) in enumerate(specs)
    ]
    health = Health(**{f"t{i}": h for i, (_, _, _, h) in enumerate(specs)})
    ranked = build_strategy(config).plan(req, candidates, health, random.Random(seed))
    assert sorted(names(ranked)) == sorted(t.provider_name for t in candidates)
    strategy_name = build_strategy(config).name
    assert all(r.reason.startswith(f"{strategy_name}: ") for r in ranked)


def test_priority_keeps_config_order():
    ranked = Priority().plan(
        REQ, [target("a"), target("b"), target("c")], Health(), random.Random(0)
    )
    assert names(ranked) == ["a", "b", "c"]
    assert ranked[0].reason == "priority: first available target"
    assert ranked[2].reason == "priority: #3"


def test_weighted_first_place_follows_the_weights():
    """Each target comes first with probability w / sum(w): 10%, 20%, 70%. With 20,000
    seeded draws the standard error is <= 0.0033; allow 4.5 of them."""
    candidates = [target("a", 1), target("b", 2), target("c", 7)]
    rng = random.Random(1234)
    draws = 20_000
    first, second = Counter(), Counter()
    strategy = Weighted()
    for _ in range(draws):
        ranked = names(strategy.plan(REQ, candidates, Health(), rng))
        first[ranked[0]] += 1
        second[ranked[1]] += 1
    assert abs(first["a"] / draws - 0.1) < 0.015
    assert abs(first["b"] / draws - 0.2) < 0.015
    assert abs(first["c"] / draws - 0.7) < 0.015
    # without replacement: P(a second) = P(b first) * 1/8 + P(c first) * 1/3 = 0.2583
    assert abs(second["a"] / draws - (0.2 / 8 + 0.7 / 3)) < 0.015


def test_weighted_zero_weight_is_a_standby_after_the_others():
    candidates = [target("standby", 0), target("a", 1), target("z", 0), target("b", 1)]
    for seed in range(50):
        ranked = Weighted().plan(REQ, candidates, Health(), random.Random(seed))
        assert names(ranked)[2:] == ["standby", "z"]
        assert ranked[3].reason == "weighted: weight 0, standby"
    assert "weight 1 of 2" in ranked[0].reason


def test_weighted_is_replayed_exactly_by_the_same_seed():
    candidates = [target(str(i), i + 1) for i in range(6)]
    a = names(Weighted().plan(REQ, candidates, Health(), random.Random(99)))
    b = names(Weighted().plan(REQ, candidates, Health(), random.Random(99)))
    assert a == b


def test_least_latency_two_candidates_always_the_faster_first():
    health = Health(slow=TargetHealth(ttft_s=0.9), fast=TargetHealth(ttft_s=0.1, tpot_s=0.001))
    for seed in range(30):
        ranked = LeastLatency().plan(
            REQ, [target("slow"), target("fast")], health, random.Random(seed)
        )
        assert names(ranked) == ["fast", "slow"]
    assert ranked[0].reason == "least_latency: better of two sampled (predicted 200ms vs 900ms)"
    assert ranked[1].reason == "least_latency: predicted 900ms"


def test_least_latency_power_of_two_choices_frequencies():
    """Three targets: the fastest is first iff it is sampled (2/3), the slowest never."""
    health = Health(
        a=TargetHealth(ttft_s=0.1), b=TargetHealth(ttft_s=0.5), c=TargetHealth(ttft_s=2.0)
    )
    rng = random.Random(7)
    firsts = Counter(
        names(LeastLatency().plan(REQ, [target("a"), target("b"), target("c")], health, rng))[0]
        for _ in range(6000)
    )
    assert firsts["c"] == 0
    assert abs(firsts["a"] / 6000 - 2 / 3) < 0.03
    ranked = LeastLatency().plan(REQ, [target("c"), target("b"), target("a")], health, rng)
    assert names(ranked)[1:] == sorted(names(ranked)[1:], key="abc".index)  # rest by prediction


def test_least_latency_explores_unmeasured_targets():
    """An unmeasured target counts as the best known: it beats slower ones and ties the
    fastest (either may win the draw)."""
    health = Health(fast=TargetHealth(ttft_s=0.1), slow=TargetHealth(ttft_s=3.0))
    vs_slow = LeastLatency().plan(REQ, [target("slow"), target("new")], health, random.Random(0))
    assert names(vs_slow)[0] == "new"
    assert vs_slow[0].reason == "least_latency: unmeasured, explored first"
    winners = {
        names(LeastLatency().plan(REQ, [target("fast"), target("new")], health, random.Random(s)))[
            0
        ]
        for s in range(40)
    }
    assert winners == {"fast", "new"}


def test_lowest_cost_cheapest_first_unpriced_last():
    candidates = [
        target("free-ish-unpriced"),
        target("dear", price=per_mtok(10, 30)),
        target("cheap", price=per_mtok(0.1, 0.4)),
        target("local", price=Price(hourly_usd=3.6, tokens_per_s=1000), local=True),
    ]
    ranked = LowestCost().plan(REQ, candidates, Health(), random.Random(0))
    # cheap: 1000*0.1e-6 + 100*0.4e-6 = 0.00014; local: 1100 * 1e-6 = 0.0011; dear: 0.013
    assert names(ranked) == ["cheap", "local", "dear", "free-ish-unpriced"]
    assert ranked[0].reason == "lowest_cost: cheapest ($0.00014 est.)"
    assert ranked[1].reason == "lowest_cost: $0.0011 est."
    assert ranked[3].reason == "lowest_cost: unpriced"


def test_slo_cheapest_feasible_then_closest_infeasible():
    req = RouteRequest(model="a", prompt_tokens=1000, max_tokens=100, slo_ttft_ms=800)
    health = Health(
        cheap_slow=TargetHealth(ttft_s=1.5),
        mid=TargetHealth(ttft_s=0.42),
        dear_fast=TargetHealth(ttft_s=0.1),
        slowest=TargetHealth(ttft_s=4.0),
    )
    candidates = [
        target("slowest", price=per_mtok(0.01, 0.01)),
        target("dear_fast", price=per_mtok(10, 30)),
        target("cheap_slow", price=per_mtok(0.05, 0.1)),
        target("mid", price=per_mtok(1, 2)),
    ]
    ranked = Slo().plan(req, candidates, health, random.Random(0))
    assert names(ranked) == ["mid", "dear_fast", "cheap_slow", "slowest"]
    assert ranked[0].reason == "slo: cheapest meeting ttft<=800ms (predicted 420ms, $0.0012 est.)"
    assert ranked[2].reason == "slo: misses ttft<=800ms; closest left (predicted 1.5s)"


def test_slo_reasons_show_the_load_the_decision_was_made_on():
    req = RouteRequest(model="a", prompt_tokens=1000, max_tokens=100, slo_ttft_ms=800)
    health = Health(
        box=TargetHealth(ttft_s=0.2, in_flight=3, ttft_load_factor=1.5),
        idle=TargetHealth(ttft_s=0.3),
        busy_flat=TargetHealth(ttft_s=0.4, in_flight=2),
    )
    candidates = [
        target("box", price=per_mtok(0.05, 0.1)),
        target("idle", price=per_mtok(1, 2)),
        target("busy_flat", price=per_mtok(5, 15)),
    ]
    ranked = Slo().plan(req, candidates, health, random.Random(0))
    assert names(ranked) == ["box", "idle", "busy_flat"]
    assert ranked[0].reason.startswith(
        "slo: cheapest meeting ttft<=800ms (predicted 300ms x1.50 at 3 in flight,"
    )
    assert "(predicted 300ms)" in ranked[1].reason  # idle: no load shown
    assert "(predicted 400ms at 2 in flight)" in ranked[2].reason  # a factor of 1 is not shown


def test_slo_ranks_targets_that_miss_by_their_chance_of_being_late():
    """At start-up: premium's mean meets 800 ms but its spread is wide; the local box's
    mean misses it with a narrow spread, so its p90 is the shorter. By the chance of
    being late, premium (~19%) comes before the box (~42%)."""
    req = RouteRequest(model="a", prompt_tokens=300, max_tokens=100, slo_ttft_ms=800)
    health = Health(
        box=TargetHealth(ttft_s=0.82, ttft_spread=0.52),
        premium=TargetHealth(ttft_s=0.539, ttft_spread=1.0),
    )
    candidates = [
        target("box", price=per_mtok(0.05, 0.1)),
        target("premium", price=per_mtok(5, 15)),
    ]
    ranked = Slo().plan(req, candidates, health, random.Random(0))
    assert names(ranked) == ["premium", "box"]
    assert all("misses ttft<=800ms" in r.reason for r in ranked)
    by_ratio = Slo().plan(
        RouteRequest(model="a", prompt_tokens=300, slo_ttft_ms=800, slo_total_ms=60_000),
        candidates,
        health,
        random.Random(0),
    )
    assert names(by_ratio) == ["box", "premium"]  # a total objective keeps the tail ratio


def test_slo_total_objective_uses_time_per_token():
    req = RouteRequest(model="a", max_tokens=1000, slo_total_ms=5000)
    health = Health(
        quick_start=TargetHealth(ttft_s=0.1, tpot_s=0.01),  # 0.1 + 10 = 10.1 s
        steady=TargetHealth(ttft_s=0.5, tpot_s=0.002),  # 0.5 + 2 = 2.5 s
    )
    candidates = [
        target("quick_start", price=per_mtok(0, 0)),
        target("steady", price=per_mtok(1, 1)),
    ]
    ranked = Slo().plan(req, candidates, health, random.Random(0))
    assert names(ranked) == ["steady", "quick_start"]
    assert "total 2.5s" in ranked[0].reason


def test_slo_unmeasured_counts_as_feasible_and_no_objective_is_lowest_cost():
    req = RouteRequest(model="a", slo_ttft_ms=200)
    health = Health(known=TargetHealth(ttft_s=0.05))
    candidates = [target("known", price=per_mtok(5, 5)), target("new", price=per_mtok(1, 1))]
    ranked = Slo().plan(req, candidates, health, random.Random(0))
    assert names(ranked) == ["new", "known"]
    assert ranked[0].reason == "slo: exploring (unmeasured), cut in time for known/m"
    # in time for known's p99 (no spread: its mean) and the switch (50 ms)
    assert ranked[0].deadline is not None and ranked[0].deadline.by_s == pytest.approx(0.1)
    # 100 ms leaves no probe a quarter of the objective: known first, new after it
    tight = Slo().plan(
        RouteRequest(model="a", slo_ttft_ms=100), candidates, health, random.Random(0)
    )
    assert names(tight) == ["known", "new"]
    by_cost_only = Slo(SloStrategy(default_ttft_ms=None))
    plain = by_cost_only.plan(RouteRequest(model="a"), candidates, health, random.Random(0))
    assert names(plain) == ["new", "known"]
    assert plain[0].reason.startswith("slo: no objective; cheapest")


def test_prefix_aware_prefers_the_replica_holding_the_prefix():
    req = RouteRequest(model="a", prefix_hashes=(1, 2, 3, 4))
    health = Health(
        r1=TargetHealth(prefix_blocks=0, in_flight=2),
        r2=TargetHealth(prefix_blocks=3, in_flight=2),
        r3=TargetHealth(prefix_blocks=0, waiting=4, kv_usage=0.5, in_flight=2),
    )
    candidates = [
        target("cloud"),
        target("r1", local=True),
        target("r2", local=True),
        target("r3", local=True),
    ]
    ranked = PrefixAware().plan(req, candidates, health, random.Random(0))
    assert names(ranked) == ["r2", "r1", "r3", "cloud"]
    # loads: r1 2, r2 2, r3 4 (4 waiting); r2: 3 * 3/4 + 2 * (1 - 2/5) + 2 * 1 = 5.45
    assert ranked[0].reason == "prefix_aware: score 5.45 (prefix 3/4 blocks, load 2, kv 0%)"
    assert ranked[3].reason == "prefix_aware: not local, config order"


def test_prefix_aware_hot_spot_loses_its_prefix_bonus():
    """mean in-flight = (20 + 1 + 0) / 3 = 7; the limit is 2 * 7 + 1 = 15 < 20."""
    req = RouteRequest(model="a", prefix_hashes=(1, 2))
    health = Health(
        hot=TargetHealth(prefix_blocks=2, in_flight=20, kv_usage=0.3),
        warm=TargetHealth(prefix_blocks=0, in_flight=1, kv_usage=0.1),
        cold=TargetHealth(prefix_blocks=0, in_flight=0),
    )
    candidates = [target("hot", local=True), target("warm", local=True), target("cold", local=True)]
    ranked = PrefixAware().plan(req, candidates, health, random.Random(0))
    assert names(ranked) == ["cold", "warm", "hot"]
    assert "prefix bonus dropped" in ranked[2].reason
    # at the limit, not over it: mean (5 + 1 + 0) / 3 = 2, limit 2 * 2 + 1 = 5
    calmer = Health(
        hot=TargetHealth(prefix_blocks=2, in_flight=5),
        warm=TargetHealth(in_flight=1),
        cold=TargetHealth(in_flight=0),
    )
    assert names(PrefixAware().plan(req, candidates, calmer, random.Random(0)))[0] == "hot"


def test_prefix_aware_counts_running_requests_as_load():
    """A replica busy with running sequences (none waiting) loses to an idle one holding
    the same prefix share: on CPU every running sequence slows the others."""
    req = RouteRequest(model="a", prefix_hashes=(1, 2, 3, 4))
    health = Health(
        busy=TargetHealth(prefix_blocks=4, running=6),
        idle=TargetHealth(prefix_blocks=3, running=0),
    )
    candidates = [target("busy", local=True), target("idle", local=True)]
    ranked = PrefixAware().plan(req, candidates, health, random.Random(0))
    # fewest matched 3, avoidable max(4 - 3, 4 / 2) = 2 blocks:
    # busy: 3 * (1/2) + 2 * (1 - 6/7) + 2 = 3.79; idle: 3 * 0 + 2 + 2 = 4.0
    assert names(ranked) == ["idle", "busy"]
    assert "load 6" in ranked[1].reason


def test_prefix_aware_scores_the_prefill_saved_beyond_a_shared_system_prompt():
    """Both replicas hold the long shared system prompt (55 of 89 blocks); one also holds
    this user's conversation (73). Saving those 18 blocks outweighs one more request in
    flight there, although the matched shares (0.82 vs 0.62) look close."""
    req = RouteRequest(model="a", prefix_hashes=tuple(range(89)))
    health = Health(
        holder=TargetHealth(prefix_blocks=73, running=2),
        other=TargetHealth(prefix_blocks=55, running=1),
    )
    candidates = [target("other", local=True), target("holder", local=True)]
    ranked = PrefixAware().plan(req, candidates, health, random.Random(0))
    # holder: 3 * 18/44.5 + 2 * (1 - 2/3) + 2 = 3.88; other: 0 + 2 * (1 - 1/3) + 2 = 3.33
    assert names(ranked) == ["holder", "other"]
    assert ranked[0].reason.startswith("prefix_aware: score 3.88 (prefix 73/89 blocks, load 2")


def test_prefix_aware_ties_are_spread_and_weights_apply():
    candidates = [target("r1", local=True), target("r2", local=True)]
    firsts = {
        names(PrefixAware().plan(REQ, candidates, Health(), random.Random(s)))[0] for s in range(30)
    }
    assert firsts == {"r1", "r2"}
    kv_only = PrefixAware(PrefixAwareStrategy(w_prefix=0, w_queue=0, w_kv=1))
    health = Health(r1=TargetHealth(kv_usage=0.9), r2=TargetHealth(kv_usage=0.2))
    assert names(kv_only.plan(REQ, candidates, health, random.Random(0))) == ["r2", "r1"]


def test_round_robin_rotates_the_first_place():
    strategy = RoundRobin()
    candidates = [target("a"), target("b"), target("c")]
    orders = [names(strategy.plan(REQ, candidates, Health(), random.Random(0))) for _ in range(4)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert strategy.plan(REQ, [], Health(), random.Random(0)) == []


def test_predictions():
    h = TargetHealth(ttft_s=0.2, tpot_s=0.01)
    assert total_s(RouteRequest(model="a", max_tokens=50), h) == pytest.approx(0.7)
    assert total_s(RouteRequest(model="a"), h) == pytest.approx(0.2 + 256 * 0.01)
    assert total_s(REQ, TargetHealth(ttft_s=0.3)) == 0.3  # no TPOT: TTFT alone
    assert total_s(REQ, UNKNOWN) is None
    assert cost_usd(REQ, target("x")) is None
    assert cost_usd(REQ, target("x", price=per_mtok(2, 8))) == pytest.approx(0.0028)
    assert (fmt_s(0.42), fmt_s(1.25), fmt_usd(0.0002), fmt_usd(1.5), fmt_usd(0)) == (
        "420ms",
        "1.2s",
        "$0.0002",
        "$1.50",
        "$0",
    )


def test_predictions_from_the_ttft_model():
    h = TargetHealth(
        ttft_s=9.0, tpot_s=0.01, ttft_base_s=0.5, ttft_per_token_s=1e-4, ttft_spread=0.25
    )
    long = RouteRequest(model="a", prompt_tokens=10_000, max_tokens=100)
    assert ttft_s(long, h) == pytest.approx(1.5)  # the fit, not the 9 s mean
    assert ttft_s(REQ, h) == pytest.approx(0.6)
    # A log-normal around the predicted mean: its median is e^(0.25^2 / 2) below it.
    assert ttft_tail_s(long, h, P90_Z) == pytest.approx(1.5 * math.exp(1.2816 * 0.25 - 0.03125))
    assert ttft_tail_s(long, h, 0.0) == pytest.approx(1.5)
    assert total_s(long, h) == pytest.approx(1.5 + 1.0)
    assert total_s(long, h, P90_Z) == pytest.approx(1.5 * math.exp(1.2816 * 0.25 - 0.03125) + 1.0)
    no_model = TargetHealth(ttft_s=0.8, ttft_spread=0.5)  # spread without a fit: mean-based
    assert ttft_s(long, no_model) == 0.8
    assert ttft_tail_s(long, no_model, 1.0) == pytest.approx(0.8 * math.exp(0.5 - 0.125))
    # A spread past z is doubt, not speed: the quantile stays at its peak, e^(z^2 / 2).
    assert ttft_tail_s(long, no_model, 0.3) == pytest.approx(0.8 * math.exp(0.045))
    unchecked = TargetHealth(ttft_base_s=0.5, ttft_per_token_s=0.0)  # no spread: tail = mean
    assert ttft_tail_s(long, unchecked, P90_Z) == 0.5
    assert ttft_tail_s(long, UNKNOWN, P90_Z) is None
    absurd = TargetHealth(ttft_base_s=1.0, ttft_per_token_s=0.0, ttft_spread=1e300)
    assert ttft_tail_s(long, absurd, P90_Z) == pytest.approx(math.exp(P90_Z**2 / 2))
    assert ttft_tail_s(long, absurd, 20.0) == pytest.approx(math.exp(50))  # finite


def test_the_tail_takes_the_spread_of_the_prompts_length_band():
    """Band spreads, where the gateway measured them, replace the overall one: a
    10,000-token prompt (band 4,096-16,383, index 3) reads 0.2."""
    h = TargetHealth(
        ttft_base_s=0.5,
        ttft_per_token_s=1e-4,
        ttft_spread=0.4,
        ttft_band_spreads=(0.4, 0.35, 0.3, 0.2, 0.1),
    )
    long = RouteRequest(model="a", prompt_tokens=10_000, max_tokens=100)
    assert h.spread_for(10_000) == 0.2 and h.spread_for(0) == 0.4 and h.spread_for(99_999) == 0.1
    assert ttft_tail_s(long, h, P90_Z) == pytest.approx(1.5 * math.exp(1.2816 * 0.2 - 0.02))
    overall = TargetHealth(ttft_base_s=0.5, ttft_per_token_s=1e-4, ttft_spread=0.4)
    assert overall.spread_for(10_000) == 0.4  # none measured per band: the overall one


# A cheap model with erratic latency and a dearer, steadier one (TTFT objective 4 s).
CHEAP = TargetHealth(ttft_s=1.2, ttft_base_s=0.8, ttft_per_token_s=6e-5, ttft_spread=0.5)
STEADY = TargetHealth(ttft_s=0.6, ttft_base_s=0.35, ttft_per_token_s=4e-5, ttft_spread=0.35)


def summarise(prompt_tokens):
    return RouteRequest(model="a", prompt_tokens=prompt_tokens, max_tokens=300, slo_ttft_ms=4000)


def test_slo_predicts_from_the_prompt_and_the_tail():
    health = Health(cheap=CHEAP, steady=STEADY)
    candidates = [
        target("steady", price=per_mtok(0.4, 1.6)),
        target("cheap", price=per_mtok(0.1, 0.4)),
    ]
    short = Slo().plan(summarise(5000), candidates, health, random.Random(0))
    # cheap: 0.8 + 0.3 = 1.1 s, tail 1.1 x e^(1.28 x 0.5 - 0.5^2 / 2) = 1.8 s <= 4 s;
    # cut at its patience now and then, steady (its rescue) is paid for too
    assert names(short) == ["cheap", "steady"]
    assert short[0].reason == (
        "slo: cheapest meeting ttft<=4000ms (predicted 1.1s (tail 1.8s), $0.00062 est., "
        "$0.00066 with its rescue)"
    )
    long = Slo().plan(summarise(30_000), candidates, health, random.Random(0))
    # cheap: 0.8 + 1.8 = 2.6 s, under 4 s on average, but its tail misses; steady: 1.6 s.
    # No target could rescue a cut at its p99 (steady's, 3.4 s, over the 2.95 s left), so
    # the tail that decides is the p99: 2.6 x e^(2.33 x 0.5 - 0.5^2 / 2) = 7.3 s (the
    # p90: 4.4 s).
    assert names(long) == ["steady", "cheap"]
    assert long[1].reason == "slo: misses ttft<=4000ms; closest left (predicted 2.6s (tail 7.3s))"
    # The mean alone (z = 0) would send the long prompt to the cheap model.
    assert names(Slo(z=0).plan(summarise(30_000), candidates, health, random.Random(0))) == [
        "cheap",
        "steady",
    ]


def test_slo_orders_infeasible_targets_by_the_objective_it_has():
    """With only a TTFT objective, the quickest to start comes first, however slowly it
    generates; with a total objective too, the worst ratio to either objective decides."""
    ttft_only = RouteRequest(model="a", max_tokens=100, slo_ttft_ms=500)
    health = Health(
        quick_start=TargetHealth(ttft_s=1.1, tpot_s=0.05),  # total 6.1 s
        quick_finish=TargetHealth(ttft_s=1.2, tpot_s=0.001),  # total 1.3 s
    )
    candidates = [target("quick_finish"), target("quick_start")]
    ranked = Slo().plan(ttft_only, candidates, health, random.Random(0))
    assert names(ranked) == ["quick_start", "quick_finish"]
    both = RouteRequest(model="a", max_tokens=100, slo_ttft_ms=500, slo_total_ms=1000)
    # quick_start: max(1.1/0.5, 6.1/1) = 6.1; quick_finish: max(1.2/0.5, 1.3/1) = 2.4
    ranked = Slo().plan(both, candidates, health, random.Random(0))
    assert names(ranked) == ["quick_finish", "quick_start"]
