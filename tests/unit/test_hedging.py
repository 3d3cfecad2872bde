"""Hedged first tokens (issue 18): the hedge moment (``deadlines.hedged_first``), the SLO
strategy's ``hedge_share``, the per-alias budget, the race (``routers.hedge``) and the
executor's hedged ``open_stream``: who serves, what the loser reports, which streams are
closed, what the rest of the plan does, and cancellation."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from core.config import RoutingConfig
from core.config_routing import SloStrategy
from core.config_tenants import Price
from core.errors import AllTargetsFailedError, InvalidRequestError, UpstreamServerError
from core.protocols import Capabilities, Timeouts
from core.routing import RouteRequest, TargetHealth, ttft_quantile_s
from routers.executor import Executor
from routers.hedge import HEDGE_FLOOR, HEDGE_WINDOW_S, CutSwitch, hedge_budget, race
from routers.strategies.deadlines import (
    MIN_PATIENCE_S,
    Deadline,
    Hedge,
    hedged_first,
)
from routers.strategies.predict import RESERVE_Z
from routers.strategies.slo import Slo
from routers.targets import Target
from routers.trace import Trace
from tests.unit.test_routing_promise import Health, Recorder

SLO_3S = RouteRequest(model="alias", slo_ttft_ms=3000)


class Upstream:
    """A provider whose stream starts after ``delay_s`` (None: never), or fails with
    ``error`` at once; it remembers whether each stream it opened was closed."""

    capabilities = Capabilities()

    def __init__(self, name: str, delay_s: float | None = 0.0, error: Exception | None = None):
        self.name = name
        self.delay_s = delay_s
        self.error = error
        self.opened = 0
        self.closed = 0

    async def stream_chat(self, req, ctx):
        self.opened += 1
        try:
            if self.error is not None:
                raise self.error
            await asyncio.sleep(3600 if self.delay_s is None else self.delay_s)
            yield f"first from {self.name}"
            yield "more"
        finally:
            self.closed += 1


def target(upstream: Upstream, price: float = 1.0) -> Target:
    return Target(
        alias="alias",
        provider_name=upstream.name,
        model="m",
        provider=upstream,
        timeouts=Timeouts(total=60.0, first_token=30.0),
        price=Price(input_per_mtok=price, output_per_mtok=price),
    )


def hedged(after_s: float | None, by_s: float = 10.0, share: float = 0.5) -> Deadline:
    return Deadline(by_s, hedge=Hedge(after_s, share))


async def open_hedged(executor, upstreams, deadline, trace=None, observer=None):
    trace = trace if trace is not None else Trace()
    first, rest = await executor.open_stream(
        "alias",
        [target(u) for u in upstreams],
        lambda t: t.provider.stream_chat(None, None),
        trace,
        observer=observer,
        deadlines={f"{upstreams[0].name}/m": deadline},
    )
    return first, rest, trace


async def settle() -> None:
    """Let cancelled generators run their cleanup."""
    for _ in range(5):
        await asyncio.sleep(0)


# ---------------------------------------------------------------- the hedge moment
def p90(mean: float, spread: float) -> float:
    return max(ttft_quantile_s(mean, spread, 1.2816), 1.5 * mean, MIN_PATIENCE_S)


def test_the_hedge_leaves_the_second_target_its_predicted_ttft_between_p90_and_p99():
    plan = [target(Upstream("a")), target(Upstream("b"))]
    # 3 s objective, b needs 0.5 s: the latest useful moment (2.45 s) is past a's p99.
    health = Health(a=TargetHealth(ttft_s=0.4, ttft_spread=0.2), b=TargetHealth(ttft_s=0.5))
    deadline = hedged_first(SLO_3S, plan, health, 0.1)
    assert deadline.hedge == Hedge(pytest.approx(ttft_quantile_s(0.4, 0.2, RESERVE_Z)), 0.1)
    assert deadline.by_s == pytest.approx(3.0 - 0.5 - 0.05)  # the cut is unchanged
    assert deadline.hedge_window_s(0.0) == pytest.approx(deadline.hedge.after_s)
    assert deadline.hedge_window_s(2.4) == pytest.approx(deadline.window_s(2.4))  # cut first
    # 800 ms, b needs 0.35 s: hedge at 0.4 s, between a's p90 and p99.
    tight = RouteRequest(model="alias", slo_ttft_ms=800)
    health = Health(a=TargetHealth(ttft_s=0.25, ttft_spread=0.3), b=TargetHealth(ttft_s=0.35))
    assert hedged_first(tight, plan, health, 0.1).hedge.after_s == pytest.approx(0.4)
    # a loaded 2x: its p90 (0.68 s) is past that moment; a on time is not doubled.
    loaded = Health(
        a=TargetHealth(ttft_s=0.25, ttft_spread=0.3, ttft_load_factor=2.0),
        b=TargetHealth(ttft_s=0.35),
    )
    assert hedged_first(tight, plan, loaded, 0.1).hedge.after_s == pytest.approx(p90(0.5, 0.3))
    # Unmeasured a: at the latest useful moment. A hedge also in hang patience (b cannot
    # save the objective at the cut; a hedge throws nothing away).
    unmeasured = hedged_first(tight, plan, Health(b=TargetHealth(ttft_s=0.35)), 0.1)
    assert unmeasured.hedge.after_s == pytest.approx(0.4)
    wide_b = Health(
        a=TargetHealth(ttft_s=0.25, ttft_spread=0.3),
        b=TargetHealth(ttft_s=0.35, ttft_spread=0.4),  # its p99 (0.82 s) fills the 800 ms
    )
    hang = hedged_first(tight, plan, wide_b, 0.1)
    assert hang.by_s == 0.0 and hang.patience_s >= 0.8
    assert hang.hedge_window_s(0.0) == pytest.approx(0.4)


def test_the_hedge_leaves_a_measured_second_target_its_p99():
    """A mid-priced first target (1.1 s, spread 0.4) and a premium backup (0.35 s, spread
    0.35) under a 3 s objective: the hedge starts when premium's p99 (0.74 s) and the
    switch are all that is left (2.21 s), not when only its mean is (2.6 s: about half
    of those rescues came too late)."""
    plan = [target(Upstream("a")), target(Upstream("b"))]
    health = Health(
        a=TargetHealth(ttft_s=1.1, ttft_spread=0.4),
        b=TargetHealth(ttft_s=0.35, ttft_spread=0.35),
    )
    deadline = hedged_first(SLO_3S, plan, health, 0.1)
    b_p99 = ttft_quantile_s(0.35, 0.35, RESERVE_Z)
    assert deadline.hedge.after_s == pytest.approx(3.0 - b_p99 - 0.05)
    assert deadline.hedge.after_s > p90(1.1, 0.4)  # still no sooner than a's patience


@pytest.mark.parametrize(
    ("req", "share", "b_ttft", "count"),
    [
        (SLO_3S, 0.0, 0.5, 2),  # off
        (RouteRequest(model="alias"), 0.1, 0.5, 2),  # no objective of its own
        (SLO_3S, 0.1, 0.5, 1),  # nothing to hedge with
        (SLO_3S, 0.1, 2.96, 2),  # b's own prediction misses the objective: no help
    ],
)
def test_no_hedge_without_share_objective_or_a_second_target_that_could_help(
    req, share, b_ttft, count
):
    plan = [target(Upstream("a")), target(Upstream("b"))][:count]
    health = Health(a=TargetHealth(ttft_s=0.4), b=TargetHealth(ttft_s=b_ttft))
    assert hedged_first(req, plan, health, share) is None


def test_the_slo_strategy_hedges_its_first_target_when_configured():
    cheap, dear = target(Upstream("cheap"), 0.1), target(Upstream("dear"), 5.0)
    health = Health(cheap=TargetHealth(ttft_s=0.4), dear=TargetHealth(ttft_s=0.3))
    plan = Slo(SloStrategy(hedge_share=0.2)).plan(SLO_3S, [cheap, dear], health, random.Random(0))
    assert [r.target.provider_name for r in plan] == ["cheap", "dear"]
    assert plan[0].deadline is not None and plan[0].deadline.hedge == Hedge(
        pytest.approx(0.6),
        0.2,  # p90 and p99 alike without a spread: 1.5 x its mean
    )
    assert plan[1].deadline is None
    plain = Slo().plan(SLO_3S, [cheap, dear], health, random.Random(0))
    assert plain[0].deadline is None  # the planner gives it the unhedged deadline
    defaulted = Slo(SloStrategy(hedge_share=0.2)).plan(
        RouteRequest(model="alias"), [cheap, dear], health, random.Random(0)
    )
    assert defaulted[0].deadline is None or defaulted[0].deadline.hedge is None


# ---------------------------------------------------------------- the budget
def test_the_budget_allows_its_share_of_offers_plus_a_floor_per_window():
    clock = FakeClock()
    budget = hedge_budget(clock)
    for _ in range(20):
        budget.record_call("alias")
    allowed = sum(budget.try_retry("alias", 0.1) for _ in range(10))
    assert allowed == int(0.1 * 20 + HEDGE_FLOOR)
    assert budget.try_retry("other", 0.1)  # per alias: the floor
    clock.advance(HEDGE_WINDOW_S + 1)
    assert budget.try_retry("alias", 0.1)  # the window forgot


@given(st.integers(0, 200), st.floats(0, 0.5), st.integers(0, 300))
def test_hedges_never_exceed_the_share_plus_the_floor(offers, share, tries):
    budget = hedge_budget(FakeClock())
    for _ in range(offers):
        budget.record_call("a")
    spent = sum(budget.try_retry("a", share) for _ in range(tries))
    assert spent <= share * offers + HEDGE_FLOOR


# ---------------------------------------------------------------- the executor
@pytest.mark.anyio
async def test_a_late_first_target_is_hedged_and_the_quicker_answer_serves():
    slow, quick, seen = Upstream("slow", 5.0), Upstream("quick", 0.0), Recorder()
    first, rest, trace = await open_hedged(
        Executor(RoutingConfig()), [slow, quick], hedged(0.05), observer=seen
    )
    assert first == "first from quick" and trace.served_by.provider_name == "quick"
    assert trace.hedge_loser.provider_name == "slow"
    assert "hedged, slow/m lost" in trace.route_reason()
    # The loser was cut as a deadline cuts: a censored wait, its stream closed.
    assert ("end", "slow/m", "AttemptDeadlineError", True) in seen.events
    await settle()
    assert slow.closed == slow.opened == 1
    assert [chunk async for chunk in rest] == ["more"]
    await rest.aclose()


@pytest.mark.anyio
async def test_a_first_target_that_answers_after_the_hedge_still_wins():
    late, hanging, seen = Upstream("late", 0.15), Upstream("hangs", None), Recorder()
    first, rest, trace = await open_hedged(
        Executor(RoutingConfig()), [late, hanging], hedged(0.05), observer=seen
    )
    assert first == "first from late" and trace.served_by.provider_name == "late"
    assert trace.hedge_loser.provider_name == "hangs"
    # The backup that lost says nothing about its target (cancelled, not cut).
    assert ("end", "hangs/m", "CancelledError", False) in seen.events
    await settle()
    assert hanging.closed == hanging.opened == 1
    await rest.aclose()


@pytest.mark.anyio
async def test_an_answer_before_the_hedge_moment_starts_no_second_attempt():
    quick, other = Upstream("quick", 0.0), Upstream("other", 0.0)
    first, rest, trace = await open_hedged(Executor(RoutingConfig()), [quick, other], hedged(1.0))
    assert first == "first from quick" and trace.hedge is None and other.opened == 0
    await rest.aclose()


@pytest.mark.anyio
async def test_without_budget_the_first_target_is_cut_at_its_deadline_instead():
    executor = Executor(RoutingConfig())
    executor.hedges.try_retry("alias", 0.0)  # the floor's one hedge, spent
    slow, quick = Upstream("slow", None), Upstream("quick", 0.0)
    first, rest, trace = await open_hedged(
        executor, [slow, quick], Deadline(0.2, hedge=Hedge(0.05, 0.0))
    )
    assert first == "first from quick" and trace.hedge is None
    assert [a.error for a in trace.attempts] == ["AttemptDeadlineError", None]
    await settle()
    assert slow.closed == 1
    await rest.aclose()


@pytest.mark.anyio
async def test_a_race_in_place_of_a_cut_starts_at_the_cut_and_needs_no_budget():
    """``rescue.raced``: ``Hedge(None, None)`` races the rescue from the cut moment, even
    with the hedge budget spent; a first target that answers after its cut still wins."""
    executor = Executor(RoutingConfig())
    executor.hedges.try_retry("alias", 0.0)  # the floor's one hedge, spent
    late, rescue, seen = Upstream("late", 0.25), Upstream("rescue", 0.5), Recorder()
    first, rest, trace = await open_hedged(
        executor, [late, rescue], Deadline(0.1, hedge=Hedge(None, None)), observer=seen
    )
    assert first == "first from late" and trace.served_by.provider_name == "late"
    assert trace.hedge_loser.provider_name == "rescue" and rescue.opened == 1
    await rest.aclose()
    # Cut alone at the same moment, the late answer was lost and the rescue served.
    late, rescue = Upstream("late", 0.25), Upstream("rescue", 0.5)
    first, rest, trace = await open_hedged(Executor(RoutingConfig()), [late, rescue], Deadline(0.1))
    assert first == "first from rescue"
    assert [a.error for a in trace.attempts] == ["AttemptDeadlineError", None]
    await rest.aclose()


@pytest.mark.anyio
async def test_a_hedged_first_target_keeps_its_cut_once_the_backup_failed():
    """A race in place of a cut whose rescue fails at once moves on at the cut, as the cut
    would have, instead of waiting for the hanging target's first-token timeout (30 s);
    with a hedge before the cut, the primary is still waited on until then, and with no
    target after the backup, for its answer."""
    config = RoutingConfig(max_attempts_per_target=1)
    hangs, third = Upstream("hangs", None), Upstream("third", 0.0)
    fails = Upstream("fails", error=UpstreamServerError("no", provider="fails"))
    clock = asyncio.get_running_loop()
    begun = clock.time()
    first, rest, trace = await asyncio.wait_for(
        open_hedged(
            Executor(config), [hangs, fails, third], Deadline(0.1, hedge=Hedge(None, None))
        ),
        timeout=5.0,
    )
    assert first == "first from third" and trace.hedge is not None
    assert [(a.label, a.error) for a in trace.attempts] == [
        ("fails/m", "UpstreamServerError"),
        ("hangs/m", "AttemptDeadlineError"),  # stopped at its cut, 0.1 s in
        ("third/m", None),
    ]
    assert clock.time() - begun < 5.0
    await settle()
    assert hangs.closed == hangs.opened == 1
    await rest.aclose()
    late = Upstream("late", 0.3)  # hedged at 0.05, the backup fails, answers at 0.3 < cut
    first, rest, trace = await open_hedged(
        Executor(config), [late, fails, third], Deadline(1.0, hedge=Hedge(0.05, None))
    )
    assert first == "first from late" and third.opened == 1
    await rest.aclose()
    # With no target after the backup, a late answer is better than none: no cut.
    late = Upstream("late", 0.3)
    first, rest, trace = await open_hedged(
        Executor(config), [late, fails], Deadline(0.1, hedge=Hedge(None, None))
    )
    assert first == "first from late" and trace.served_by.provider_name == "late"
    await rest.aclose()


@pytest.mark.anyio
async def test_a_race_in_place_of_a_cut_does_not_start_before_the_cut():
    quick, rescue = Upstream("quick", 0.05), Upstream("rescue", 0.0)
    first, rest, trace = await open_hedged(
        Executor(RoutingConfig()), [quick, rescue], Deadline(0.3, hedge=Hedge(None, None))
    )
    assert first == "first from quick" and trace.hedge is None and rescue.opened == 0
    await rest.aclose()


@pytest.mark.anyio
async def test_a_first_target_that_fails_early_falls_back_unhedged():
    broken = Upstream("broken", error=UpstreamServerError("boom", provider="broken"))
    quick = Upstream("quick", 0.0)
    first, rest, trace = await open_hedged(Executor(RoutingConfig()), [broken, quick], hedged(1.0))
    assert first == "first from quick" and trace.hedge is None
    assert [a.error for a in trace.attempts] == ["UpstreamServerError", None]
    await rest.aclose()


@pytest.mark.anyio
async def test_when_both_racers_fail_the_plan_goes_on_and_then_reports_them_all():
    config = RoutingConfig(max_attempts_per_target=1)
    fails = Upstream("fails", error=UpstreamServerError("no", provider="fails"))

    class FailsLate(Upstream):
        async def stream_chat(self, req, ctx):
            self.opened += 1
            try:
                await asyncio.sleep(0.1)
                raise UpstreamServerError("late", provider=self.name)
                yield "never"
            finally:
                self.closed += 1

    third = Upstream("third", 0.0)
    first, rest, trace = await open_hedged(
        Executor(config), [FailsLate("late"), fails, third], hedged(0.02)
    )
    assert first == "first from third"
    assert sorted(a.label for a in trace.attempts if a.error) == ["fails/m", "late/m"]
    await rest.aclose()
    with pytest.raises(AllTargetsFailedError) as caught:
        await open_hedged(Executor(config), [FailsLate("late2"), fails], hedged(0.02))
    assert len(caught.value.failures) == 2


@pytest.mark.anyio
async def test_a_client_error_from_the_first_target_is_raised_not_hedged():
    refused = Upstream("refused", error=InvalidRequestError("bad"))
    other = Upstream("other", 0.0)
    with pytest.raises(InvalidRequestError):
        await open_hedged(Executor(RoutingConfig()), [refused, other], hedged(1.0))
    assert other.opened == 0


@pytest.mark.anyio
async def test_a_client_that_leaves_mid_race_closes_both_upstream_streams():
    a, b = Upstream("a", None), Upstream("b", None)
    task = asyncio.ensure_future(open_hedged(Executor(RoutingConfig()), [a, b], hedged(0.02)))
    await asyncio.sleep(0.1)  # both racing
    assert (a.opened, b.opened) == (1, 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await settle()
    assert (a.closed, b.closed) == (1, 1)


# ---------------------------------------------------------------- the race itself
def run_race(primary, backup, discard, *, hedge_after_s=0.0, cut_after_s=None, allow=None):
    """``race`` with a hedge always allowed (after ``allow()``, when given) and a plain
    cut error."""

    async def may_hedge() -> bool:
        if allow is not None:
            allow()
        return True

    return race(
        primary,
        backup,
        hedge_after_s=hedge_after_s,
        cut_after_s=cut_after_s,
        may_hedge=may_hedge,
        switch=CutSwitch(),
        cut_error=lambda: RuntimeError("cut"),
        discard=discard,
    )


def both_at_once():
    """A primary and a backup that answer in the same turn of the loop, and the hook
    that sets them off as the hedge starts."""
    hedging = asyncio.Event()

    async def primary() -> str:
        await hedging.wait()
        return "primary"

    async def backup() -> str:
        return "backup"

    return primary, backup, hedging.set


@pytest.mark.anyio
async def test_a_primary_stopped_outside_its_wait_is_cancelled_and_counted_as_cut():
    """A primary between two tries (a backoff sleep, no wait armed) cannot be cut through
    its switch: it is cancelled, and the race records the cut error for it."""

    async def backing_off() -> str:
        await asyncio.sleep(3600)
        return "never"

    async def backup() -> str:
        await asyncio.sleep(0.01)
        return "backup"

    async def discard(value: str) -> None:
        raise AssertionError("nothing to discard")

    result = await run_race(backing_off, backup, discard, hedge_after_s=0.01, cut_after_s=1.0)
    assert (result.winner, result.value, result.hedged) == (1, "backup", True)
    assert [str(e) for e in result.errors] == ["cut"]


@pytest.mark.anyio
async def test_when_both_succeed_at_once_the_primary_wins_and_the_other_is_released():
    released: list[str] = []
    primary, backup, start = both_at_once()

    async def discard(value: str) -> None:
        released.append(value)

    result = await run_race(primary, backup, discard, allow=start)
    assert (result.winner, result.value, result.hedged) == (0, "primary", True)
    assert released == ["backup"]


@pytest.mark.anyio
async def test_a_race_cancelled_after_its_winner_was_found_releases_the_winner():
    """The client leaves while the race is still releasing the loser's late answer: the
    winner's answer, which nobody will read, is released too."""
    released: list[str] = []
    primary, backup, start = both_at_once()

    async def discard(value: str) -> None:
        released.append(value)
        if value == "backup":
            await asyncio.sleep(3600)  # a slow release: the client leaves meanwhile

    task = asyncio.ensure_future(run_race(primary, backup, discard, allow=start))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert released == ["backup", "primary"]
