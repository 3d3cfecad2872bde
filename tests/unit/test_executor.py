"""The executor's retry and fallback rules, with scripted providers and no real sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from core.config import RoutingConfig
from core.config_routing import RetryBudgetConfig
from core.errors import (
    AllTargetsFailedError,
    NoTargetAvailableError,
    UpstreamBadRequestError,
    UpstreamConnectError,
    UpstreamMalformedError,
    UpstreamRateLimitedError,
    UpstreamServerError,
    UpstreamTimeoutError,
)
from core.protocols import Capabilities, Timeouts
from routers.executor import Executor
from routers.planner import Plan
from routers.retry_budget import RetryBudget
from routers.streams import close_stream
from routers.targets import Skipped, Target
from routers.trace import Trace

pytestmark = pytest.mark.anyio


class Scripted:
    """A provider whose calls return or raise the next scripted outcome."""

    capabilities = Capabilities()

    def __init__(self, name, outcomes):
        self.name = name
        self.outcomes = list(outcomes)
        self.calls = 0

    def next(self):
        self.calls += 1
        outcome = self.outcomes.pop(0) if self.outcomes else "ok"
        if isinstance(outcome, Exception):
            raise outcome
        return f"{self.name}:{outcome}"

    async def chat(self, req, ctx):
        return self.next()

    async def stream_chat(self, req, ctx) -> AsyncIterator[str]:
        yield self.next()
        yield "rest"


def target(provider, first_token=5.0):
    return Target(
        alias="alias",
        provider_name=provider.name,
        model="m",
        provider=provider,
        timeouts=Timeouts(total=5.0, first_token=first_token),
    )


class Sleeps(list):
    async def __call__(self, seconds):
        self.append(seconds)


def executor(sleeps, attempts=2, max_retry_after=2.0):
    config = RoutingConfig(
        max_attempts_per_target=attempts, retry_backoff_s=0.1, max_retry_after_s=max_retry_after
    )
    return Executor(config, sleep=sleeps, jitter=lambda: 0.5)


async def run(ex, providers):
    trace = Trace()
    result = await ex.call(
        "alias", [target(p) for p in providers], lambda t: t.provider.chat(None, None), trace
    )
    return result, trace


async def test_connect_errors_retry_the_same_target_with_backoff():
    sleeps = Sleeps()
    a = Scripted("a", [UpstreamConnectError("refused"), "ok"])
    result, trace = await run(executor(sleeps), [a])
    assert result == "a:ok" and a.calls == 2
    assert sleeps == [0.1]  # base 0.1 * 2**0 * (0.5 + 0.5)
    assert trace.fallbacks == 0


async def test_short_retry_after_is_honoured_on_the_same_target():
    sleeps = Sleeps()
    a = Scripted("a", [UpstreamRateLimitedError("slow down", retry_after=1.5), "ok"])
    result, _ = await run(executor(sleeps), [a])
    assert result == "a:ok" and sleeps == [1.5]


async def test_long_retry_after_falls_back_at_once():
    sleeps = Sleeps()
    a = Scripted("a", [UpstreamRateLimitedError("slow down", retry_after=30)])
    b = Scripted("b", ["ok"])
    result, trace = await run(executor(sleeps), [a, b])
    assert result == "b:ok" and sleeps == [] and a.calls == 1
    assert trace.fallbacks == 1 and "fallback after alias" not in trace.route_reason()
    assert trace.route_reason().startswith("fallback after a/m")


async def test_client_errors_never_fall_back():
    a = Scripted("a", [UpstreamBadRequestError("no")])
    b = Scripted("b", ["ok"])
    with pytest.raises(UpstreamBadRequestError):
        await run(executor(Sleeps()), [a, b])
    assert b.calls == 0


async def test_all_failures_are_collected():
    a = Scripted("a", [UpstreamServerError("boom", provider="a")])
    b = Scripted("b", [UpstreamTimeoutError("late", provider="b")])
    with pytest.raises(AllTargetsFailedError) as info:
        await run(executor(Sleeps()), [a, b])
    assert info.value.status == 502 and len(info.value.failures) == 2
    assert "a: boom" in info.value.message and "b: late" in info.value.message


def test_aggregate_status_follows_the_failures():
    limited = [
        UpstreamRateLimitedError("x", retry_after=9),
        UpstreamRateLimitedError("y", retry_after=4),
    ]
    error = AllTargetsFailedError("m", limited)
    assert (error.status, error.retry_after) == (429, 4)
    assert AllTargetsFailedError("m", [UpstreamTimeoutError("t")]).status == 504


async def test_empty_plan_is_503_with_the_reasons():
    trace = Trace([Skipped("oa/gpt", "environment variable K is not set")])
    with pytest.raises(NoTargetAvailableError) as info:
        await executor(Sleeps()).call("alias", [], lambda t: t.provider.chat(None, None), trace)
    assert "K is not set" in info.value.message


async def test_stream_falls_back_until_the_first_chunk():
    a = Scripted("a", [UpstreamServerError("boom")])
    b = Scripted("b", ["first"])
    trace = Trace()
    first, rest = await executor(Sleeps()).open_stream(
        "alias", [target(a), target(b)], lambda t: t.provider.stream_chat(None, None), trace
    )
    assert first == "b:first"
    assert [item async for item in rest] == ["rest"]
    assert trace.served_by.provider_name == "b"


async def test_stream_first_chunk_deadline():
    class Stalls(Scripted):
        async def stream_chat(self, req, ctx):
            import asyncio

            await asyncio.sleep(10)
            yield "never"

    stalled, b = Stalls("a", []), Scripted("b", ["first"])
    trace = Trace()
    plan = [target(stalled, first_token=0.05), target(b)]
    first, _ = await executor(Sleeps()).open_stream(
        "alias", plan, lambda t: t.provider.stream_chat(None, None), trace
    )
    assert first == "b:first"
    assert trace.attempts[0].error == "UpstreamTimeoutError"


async def test_empty_stream_is_malformed():
    class Empty(Scripted):
        async def stream_chat(self, req, ctx):
            return
            yield  # pragma: no cover

    with pytest.raises(AllTargetsFailedError) as info:
        await executor(Sleeps()).open_stream(
            "alias", [target(Empty("a", []))], lambda t: t.provider.stream_chat(None, None), Trace()
        )
    assert isinstance(info.value.failures[0], UpstreamMalformedError)


@given(st.lists(st.sampled_from(["ok", "5xx", "conn", "400"]), min_size=1, max_size=6))
def test_fallback_stops_at_first_success_or_client_error(outcomes):
    """Property: targets after the serving one (or after a 400) are never called."""
    import anyio

    errors = {
        "5xx": UpstreamServerError("x"),
        "conn": UpstreamConnectError("x"),
        "400": UpstreamBadRequestError("x"),
    }
    providers = [
        Scripted(str(i), [errors.get(o, o), errors.get(o, o)]) for i, o in enumerate(outcomes)
    ]

    async def scenario():
        try:
            return (await run(executor(Sleeps()), providers))[0]
        except (AllTargetsFailedError, UpstreamBadRequestError):
            return None

    result = anyio.run(scenario)
    stop = next((i for i, o in enumerate(outcomes) if o in ("ok", "400")), len(outcomes) - 1)
    assert all(p.calls == 0 for p in providers[stop + 1 :])
    assert (result == f"{stop}:ok") == (outcomes[stop] == "ok")


# --- observer, gate, retry budget, idle timeout, route reasons -----------------------------


class Recorder:
    """An AttemptObserver that writes down what it is told."""

    def __init__(self):
        self.events = []

    def attempt_started(self, label):
        self.events.append(("start", label))

    def attempt_finished(self, label, *, error, ttft_s, retryable):
        self.events.append(("end", label, error, ttft_s, retryable))


class Timed(Scripted):
    """Moves the fake clock by ``took`` seconds during each call."""

    def __init__(self, name, outcomes, clock, took):
        super().__init__(name, outcomes)
        self.clock, self.took = clock, took

    async def chat(self, req, ctx):
        self.clock.advance(self.took)
        return self.next()


class Gate:
    def __init__(self, verdicts):
        self.verdicts = verdicts  # label -> list of verdicts, the last one repeats
        self.asked = []

    async def __call__(self, t):
        self.asked.append(t.label)
        answers = self.verdicts.get(t.label, [True])
        return answers.pop(0) if len(answers) > 1 else answers[0]


def wired(sleeps=None, attempts=2, **kwargs):
    config = RoutingConfig(
        max_attempts_per_target=attempts, retry_backoff_s=0.1, **kwargs.pop("routing", {})
    )
    return Executor(
        config,
        sleep=sleeps if sleeps is not None else Sleeps(),
        jitter=kwargs.pop("jitter", lambda: 0.5),
        **kwargs,
    )


async def test_observer_hears_every_attempt_with_its_outcome_and_time():
    clock, seen = FakeClock(), Recorder()
    a = Timed("a", [UpstreamConnectError("x"), UpstreamServerError("y")], clock, 0.5)
    b = Timed("b", ["ok"], clock, 0.25)
    result, _ = await run(wired(observer=seen, clock=clock), [a, b])
    assert result == "b:ok"
    assert seen.events == [
        ("start", "a/m"),
        ("end", "a/m", "UpstreamConnectError", None, True),
        ("start", "a/m"),
        ("end", "a/m", "UpstreamServerError", None, False),
        ("start", "b/m"),
        ("end", "b/m", None, 0.25, False),
    ]


async def test_cancelled_attempt_is_reported_as_cancelled():
    seen = Recorder()

    class Hangs(Scripted):
        async def chat(self, req, ctx):
            await asyncio.Event().wait()

    task = asyncio.ensure_future(run(wired(observer=seen, clock=FakeClock()), [Hangs("a", [])]))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen.events == [("start", "a/m"), ("end", "a/m", "CancelledError", None, False)]


async def test_gate_skips_targets_with_its_reason():
    a, b, c = Scripted("a", ["ok"]), Scripted("b", ["ok"]), Scripted("c", ["ok"])
    gate = Gate({"a/m": [False], "b/m": ["probe limit"]})
    result, trace = await run(wired(gate=gate), [a, b, c])
    assert result == "c:ok" and a.calls == b.calls == 0
    assert [(s.label, s.reason) for s in trace.skipped] == [
        ("a/m", "circuit open"),
        ("b/m", "probe limit"),
    ]
    assert trace.route_reason() == (
        "priority: first available target; skipped a/m (circuit open), b/m (probe limit)"
    )


async def test_every_target_refused_by_the_gate_is_503():
    with pytest.raises(NoTargetAvailableError) as info:
        await run(wired(gate=Gate({"a/m": [False]})), [Scripted("a", ["ok"])])
    assert "a/m: circuit open" in info.value.message and info.value.status == 503


async def test_a_breaker_that_opens_mid_retry_stops_the_retries():
    a = Scripted("a", [UpstreamConnectError("x"), "ok"])
    b = Scripted("b", ["ok"])
    sleeps = Sleeps()
    gate = Gate({"a/m": [True, "circuit open"]})  # admits the first try, not the retry
    result, trace = await run(wired(sleeps, attempts=3, gate=gate), [a, b])
    assert result == "b:ok" and a.calls == 1 and sleeps == []
    assert gate.asked == ["a/m", "a/m", "b/m"]
    assert trace.skipped == [] and trace.route_reason() == "fallback after a/m failed"


async def test_exhausted_retry_budget_falls_back_instead_of_retrying():
    clock = FakeClock()
    budget = RetryBudget(RetryBudgetConfig(ratio=0.0, min_per_s=0.1, window_s=10), clock)
    sleeps = Sleeps()
    ex = wired(sleeps, attempts=3, retry_budget=budget, clock=clock)
    a = Scripted("a", [UpstreamConnectError("x")] * 3)
    b = Scripted("b", ["ok", "ok"])
    result, _ = await run(ex, [a, b])
    assert result == "b:ok" and a.calls == 2 and sleeps == [0.1]  # one retry in the budget
    a.outcomes = [UpstreamConnectError("x")] * 3
    result, _ = await run(ex, [a, b])
    assert result == "b:ok" and a.calls == 3 and sleeps == [0.1]  # budget spent: no retry


async def test_retries_keep_exponential_backoff_with_jitter():
    jitters = iter([0.0, 1.0])
    sleeps = Sleeps()
    ex = wired(sleeps, attempts=3, jitter=lambda: next(jitters))
    a = Scripted("a", [UpstreamConnectError("x"), UpstreamConnectError("x"), "ok"])
    result, _ = await run(ex, [a])
    assert result == "a:ok"
    assert sleeps == pytest.approx([0.1 * 0.5, 0.2 * 1.5])


async def test_stalled_stream_ends_with_an_idle_timeout_and_closes_upstream():
    closed = []

    class Stalls(Scripted):
        async def stream_chat(self, req, ctx):
            try:
                yield "first"
                yield "second"
                await asyncio.sleep(10)
                yield "never"
            finally:
                closed.append(True)

    provider = Stalls("a", [])
    plan = [
        Target(
            alias="alias",
            provider_name="a",
            model="m",
            provider=provider,
            timeouts=Timeouts(first_token=5.0, idle=0.05),
        )
    ]
    first, rest = await wired().open_stream(
        "alias", plan, lambda t: t.provider.stream_chat(None, None), Trace()
    )
    assert first == "first"
    assert await anext(rest) == "second"
    with pytest.raises(UpstreamTimeoutError, match=r"sent nothing for 0\.05s"):
        await anext(rest)
    assert closed == [True]


async def test_closing_a_stream_early_closes_the_upstream():
    closed = []

    class Endless(Scripted):
        async def stream_chat(self, req, ctx):
            try:
                while True:
                    yield "chunk"
            finally:
                closed.append(True)

    first, rest = await wired().open_stream(
        "alias", [target(Endless("a", []))], lambda t: t.provider.stream_chat(None, None), Trace()
    )
    assert first == "chunk" and await anext(rest) == "chunk"
    await close_stream(rest)
    assert closed == [True]
    # closed before the rest was ever read: the upstream is released all the same
    first, rest = await wired().open_stream(
        "alias", [target(Endless("a", []))], lambda t: t.provider.stream_chat(None, None), Trace()
    )
    await close_stream(rest)
    assert closed == [True, True]


async def test_route_reason_shows_the_strategy_reason_fallbacks_and_skips():
    a = Scripted("a", [UpstreamServerError("x")])
    b = Scripted("b", ["ok"])
    plan = Plan(
        ordered=[target(a), target(b)],
        skipped=[Skipped("local/smollm2", "saturated")],
        reasons={"a/m": "lowest_cost: cheapest ($0.0001 est.)", "b/m": "lowest_cost: $0.0002 est."},
    )
    trace = Trace.from_plan(plan, [Skipped("x/y", "environment variable K is not set")])
    result = await wired(attempts=1).call(
        "alias", plan.ordered, lambda t: t.provider.chat(None, None), trace
    )
    assert result == "b:ok"
    assert trace.route_reason() == (
        "lowest_cost: $0.0002 est.; fallback after a/m failed; "
        "tried a/m (lowest_cost: cheapest ($0.0001 est.)); "
        "skipped x/y (environment variable K is not set), local/smollm2 (saturated)"
    )


async def test_route_reason_says_why_each_failed_target_was_tried_in_order():
    c, a, b = (
        Scripted("c", [UpstreamServerError("x")]),
        Scripted("a", [UpstreamServerError("y")]),
        Scripted("b", ["ok"]),
    )
    plan = Plan(
        ordered=[target(c), target(a), target(b)],
        reasons={"c/m": "slo: cheapest (predicted 300ms x1.50 at 3 in flight)", "b/m": "slo: next"},
    )
    trace = Trace.from_plan(plan)
    result = await wired(attempts=1).call(
        "alias", plan.ordered, lambda t: t.provider.chat(None, None), trace
    )
    assert result == "b:ok"
    assert trace.route_reason() == (
        "slo: next; fallback after a/m, c/m failed; "
        "tried c/m (slo: cheapest (predicted 300ms x1.50 at 3 in flight))"
    )  # a/m has no reason of its own: only its failure is told


async def test_per_call_observer_and_gate_replace_the_executors_own():
    default, per_call = Recorder(), Recorder()
    ex = wired(observer=default, gate=Gate({"a/m": [False]}), clock=FakeClock())
    trace = Trace()
    result = await ex.call(
        "alias",
        [target(Scripted("a", ["ok"]))],
        lambda t: t.provider.chat(None, None),
        trace,
        observer=per_call,
        gate=Gate({}),
    )
    assert result == "a:ok" and default.events == []
    assert per_call.events == [("start", "a/m"), ("end", "a/m", None, 0.0, False)]
    first, _ = await ex.open_stream(
        "alias",
        [target(Scripted("b", ["x"]))],
        lambda t: t.provider.stream_chat(None, None),
        Trace(),
        observer=per_call,
    )
    assert first == "b:x" and per_call.events[-1] == ("end", "b/m", None, 0.0, False)
    with pytest.raises(NoTargetAvailableError):  # the executor's own gate when none is given
        await ex.call(
            "alias", [target(Scripted("a", ["ok"]))], lambda t: t.provider.chat(None, None), Trace()
        )
