"""The planner: filters (residency, capabilities, context, breakers, saturation) then the
strategy; and the invariants every plan keeps."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.config_routing import LowestCostStrategy, PriorityStrategy, WeightedStrategy
from core.config_tenants import Price
from core.errors import ContextLengthError, InvalidRequestError
from core.protocols import Capabilities, Timeouts
from core.routing import UNKNOWN, RouteRequest, TargetHealth
from core.wire import ChatRequest, FunctionDef, Message, Tool
from routers.filters import filter_context, filter_health, filter_local
from routers.planner import Plan, plan_route
from routers.strategies import Priority, build_strategy
from routers.targets import Target


class Provider:
    def __init__(self, name, **caps):
        self.name = name
        self.capabilities = Capabilities(**caps)


def target(name, local=False, max_context=None, price=None, **caps):
    return Target(
        alias="a",
        provider_name=name,
        model="m",
        provider=Provider(name, **caps),
        timeouts=Timeouts(),
        local=local,
        max_context=max_context,
        price=price,
    )


class Health:
    def __init__(self, **by_name):
        self.by_label = {f"{name}/m": h for name, h in by_name.items()}

    def health(self, label):
        return self.by_label.get(label, UNKNOWN)


def names(targets):
    return [t.provider_name for t in targets]


def plan(req, targets, health=None, strategy=None, needs=None) -> Plan:
    return plan_route(
        req, targets, health or Health(), strategy or Priority(), random.Random(0), needs
    )


CHAT_WITH_TOOLS = ChatRequest(
    model="a",
    messages=[Message(role="user", content="hi")],
    tools=[Tool(function=FunctionDef(name="f"))],
)


def test_strategy_orders_the_survivors_and_reasons_are_per_label():
    targets = [
        target("dear", price=Price(input_per_mtok=10)),
        target("cheap", price=Price(input_per_mtok=1)),
    ]
    result = plan(
        RouteRequest(model="a", prompt_tokens=100),
        targets,
        strategy=build_strategy(LowestCostStrategy()),
    )
    assert names(result.ordered) == ["cheap", "dear"]
    assert result.reasons["cheap/m"].startswith("lowest_cost: cheapest")
    assert result.skipped == [] and result.saturated == []


def test_local_only_never_reaches_a_non_local_target():
    targets = [target("cloud"), target("gpu", local=True), target("cloud2")]
    result = plan(RouteRequest(model="a", local_only=True), targets)
    assert names(result.ordered) == ["gpu"]
    assert [(s.label, s.reason) for s in result.skipped] == [
        ("cloud/m", "not local (data residency)"),
        ("cloud2/m", "not local (data residency)"),
    ]
    # nothing local left: an empty plan (the executor answers 503), never a cloud target
    none_left = plan(RouteRequest(model="a", local_only=True), [target("cloud")])
    assert none_left.ordered == []


def test_capabilities_skip_and_400_when_none_is_capable():
    targets = [target("plain", tools=False), target("tooled")]
    result = plan(RouteRequest(model="a"), targets, needs=CHAT_WITH_TOOLS)
    assert names(result.ordered) == ["tooled"]
    assert result.skipped[0].reason == "lacks tools"
    with pytest.raises(InvalidRequestError) as info:
        plan(RouteRequest(model="a"), [target("plain", tools=False)], needs=CHAT_WITH_TOOLS)
    assert info.value.param == "tools" and info.value.status == 400
    # without ``needs`` (an endpoint with no capability needs) nothing is checked
    assert names(plan(RouteRequest(model="a"), [target("plain", tools=False)]).ordered) == ["plain"]


def test_context_window_skip_and_400_when_nothing_fits():
    req = RouteRequest(model="a", prompt_tokens=7000, max_tokens=1000)
    targets = [
        target("small", max_context=4096),
        target("big", max_context=8000),
        target("unknown"),
    ]
    result = plan(req, targets)
    assert names(result.ordered) == ["big", "unknown"]
    assert result.skipped[0].reason == "context 4096 < 8000"
    with pytest.raises(ContextLengthError) as info:
        plan(req, [target("small", max_context=4096), target("mid", max_context=7999)])
    assert info.value.code == "context_length_exceeded" and "7999" in info.value.message
    assert info.value.param == "max_tokens"  # the prompt alone would fit in 7999
    with pytest.raises(ContextLengthError) as info:
        plan(RouteRequest(model="a", prompt_tokens=9000), [target("mid", max_context=7999)])
    assert info.value.param == "messages"
    # without max_tokens only the prompt must fit: the upstream stops at its limit
    unbounded = plan(
        RouteRequest(model="a", prompt_tokens=4000), [target("small", max_context=4096)]
    )
    assert names(unbounded.ordered) == ["small"]


def test_open_breakers_and_saturated_replicas_are_skipped():
    health = Health(
        down=TargetHealth(breaker="open"),
        busy=TargetHealth(saturated=True),
        probing=TargetHealth(breaker="half_open"),
    )
    targets = [target("down"), target("busy", local=True), target("probing"), target("ok")]
    result = plan(RouteRequest(model="a"), targets, health)
    assert names(result.ordered) == ["probing", "ok"]
    assert [(s.label, s.reason) for s in result.skipped] == [
        ("down/m", "circuit open"),
        ("busy/m", "saturated"),
    ]
    assert names(result.saturated) == ["busy"]


def test_filters_run_residency_first():
    """Residency runs before capabilities: a local_only request that no local target can
    express is a 400 (the capable cloud target was never an option), not an empty plan."""
    targets = [target("cloud"), target("gpu", local=True, tools=False)]
    with pytest.raises(InvalidRequestError):
        plan(RouteRequest(model="a", local_only=True), targets, needs=CHAT_WITH_TOOLS)
    kept, skipped = filter_local(targets)
    assert names(kept) == ["gpu"] and skipped[0].label == "cloud/m"
    assert filter_context(10, 10, []) == ([], [])
    assert filter_health([], Health()) == ([], [], [])


specs = st.lists(
    st.tuples(
        st.booleans(),  # local
        st.none() | st.integers(1, 20_000),  # max_context
        st.sampled_from(["closed", "open", "half_open"]),
        st.booleans(),  # saturated
        st.floats(0, 3),  # weight
    ),
    max_size=8,
)


@given(
    specs,
    st.booleans(),
    st.integers(0, 10_000),
    st.integers(0, 2**32),
    st.sampled_from([PriorityStrategy(), WeightedStrategy(), LowestCostStrategy()]),
    st.frozensets(st.integers(0, 7)),
)
def test_plan_invariants(specs, local_only, prompt_tokens, seed, strategy_config, denied):
    """Every plan is an ordering of a subset of the candidates (no duplicates, no
    outsiders); every candidate is either planned or skipped; a local_only request never
    gets a non-local target, nor any request a provider its tenant denies; filtered
    targets never appear."""
    deny = tuple(f"t{i}" for i in denied)
    targets = [
        Target(
            alias="a",
            provider_name=f"t{i}",
            model="m",
            provider=Provider(f"t{i}"),
            timeouts=Timeouts(),
            local=local,
            max_context=ctx,
            weight=w,
        )
        for i, (local, ctx, _, _, w) in enumerate(specs)
    ]
    health = Health(
        **{f"t{i}": TargetHealth(breaker=b, saturated=s) for i, (_, _, b, s, _) in enumerate(specs)}
    )
    req = RouteRequest(
        model="a",
        prompt_tokens=prompt_tokens,
        max_tokens=100,
        local_only=local_only,
        deny_providers=deny,
    )
    try:
        result = plan_route(
            req, targets, health, build_strategy(strategy_config), random.Random(seed)
        )
    except ContextLengthError:
        fitting = [
            t
            for t in targets
            if (t.local or not local_only)
            and t.provider_name not in deny
            and (t.max_context is None or t.max_context >= prompt_tokens + 100)
        ]
        assert fitting == []
        return
    planned = [t.label for t in result.ordered]
    assert len(planned) == len(set(planned))
    assert set(planned) <= {t.label for t in targets}
    assert sorted(planned + [s.label for s in result.skipped]) == sorted(t.label for t in targets)
    skipped = {s.label for s in result.skipped}
    assert not skipped & set(planned)
    for t in result.ordered:
        h = health.health(t.label)
        assert h.breaker != "open" and not h.saturated
        assert t.max_context is None or t.max_context >= prompt_tokens + 100
        assert t.local or not local_only
        assert t.provider_name not in deny
    assert set(result.reasons) == set(planned)
    assert {t.label for t in result.saturated} <= skipped


def test_tenant_provider_lists_filter_the_whole_plan():
    targets = [target("cloud"), target("other"), target("local", local=True)]
    allowed = plan(RouteRequest(model="a", providers=("cloud", "local")), targets)
    assert [t.provider_name for t in allowed.ordered] == ["cloud", "local"]
    assert [(s.label, s.reason) for s in allowed.skipped] == [
        ("other/m", "provider not allowed for this tenant")
    ]
    denied = plan(
        RouteRequest(model="a", providers=("cloud", "local"), deny_providers=("cloud",)), targets
    )
    assert [t.provider_name for t in denied.ordered] == ["local"]
