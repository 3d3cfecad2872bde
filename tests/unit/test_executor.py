"""The executor's retry and fallback rules, with scripted providers and no real sleeping."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.config import RoutingConfig
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
from routers.executor import Executor, Trace
from routers.targets import Skipped, Target

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
    config = RoutingConfig(max_attempts_per_target=attempts, retry_backoff_s=0.1,
                           max_retry_after_s=max_retry_after)
    return Executor(config, sleep=sleeps, jitter=lambda: 0.5)


async def run(ex, providers):
    trace = Trace()
    result = await ex.call("alias", [target(p) for p in providers],
                           lambda t: t.provider.chat(None, None), trace)
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
    limited = [UpstreamRateLimitedError("x", retry_after=9), UpstreamRateLimitedError("y", retry_after=4)]
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
        "alias", [target(a), target(b)], lambda t: t.provider.stream_chat(None, None), trace)
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
        "alias", plan, lambda t: t.provider.stream_chat(None, None), trace)
    assert first == "b:first"
    assert trace.attempts[0].error == "UpstreamTimeoutError"


async def test_empty_stream_is_malformed():
    class Empty(Scripted):
        async def stream_chat(self, req, ctx):
            return
            yield  # pragma: no cover

    with pytest.raises(AllTargetsFailedError) as info:
        await executor(Sleeps()).open_stream(
            "alias", [target(Empty("a", []))], lambda t: t.provider.stream_chat(None, None), Trace())
    assert isinstance(info.value.failures[0], UpstreamMalformedError)


@given(st.lists(st.sampled_from(["ok", "5xx", "conn", "400"]), min_size=1, max_size=6))
def test_fallback_stops_at_first_success_or_client_error(outcomes):
    """Property: targets after the serving one (or after a 400) are never called."""
    import anyio

    errors = {"5xx": UpstreamServerError("x"), "conn": UpstreamConnectError("x"),
              "400": UpstreamBadRequestError("x")}
    providers = [Scripted(str(i), [errors.get(o, o), errors.get(o, o)]) for i, o in enumerate(outcomes)]

    async def scenario():
        try:
            return (await run(executor(Sleeps()), providers))[0]
        except (AllTargetsFailedError, UpstreamBadRequestError):
            return None

    result = anyio.run(scenario)
    stop = next((i for i, o in enumerate(outcomes) if o in ("ok", "400")), len(outcomes) - 1)
    assert all(p.calls == 0 for p in providers[stop + 1:])
    assert (result == f"{stop}:ok") == (outcomes[stop] == "ok")
