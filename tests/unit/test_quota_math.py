"""Quotas on the memory store with a FakeClock: window math, every limit kind, headers,
reconciliation, key vs tenant scopes, failure modes, and Hypothesis invariants."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.clock import FakeClock
from core.config_tenants import Limits, TenantConfig
from core.errors import RateLimitError, ServiceUnavailableError
from core.tenancy import ADMIN, OPEN, Principal
from policies.quotas import Admission, QuotaManager
from policies.quotas.windows import Window, bounds, fits, format_reset, seconds_left
from policies.store.base import StoreUnavailableError
from policies.store.memory import MemoryStore

# FakeClock's wall time 1_700_000_000 is 20 s into a UTC minute (2023-11-14 22:13:20).
MINUTE_LEFT = 40.0


def run(coro):
    """Drive a coroutine that never suspends (the memory store never does) to its end."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the coroutine suspended")


def who(tenant: str = "acme", key: str | None = "k1") -> Principal:
    return Principal(tenant=tenant, key_id=key, via="api_key")


def manager(clock: FakeClock, fallback=None, store=None, **tenants: TenantConfig) -> QuotaManager:
    store = store or MemoryStore(clock)
    return QuotaManager(tenants, store, fallback or MemoryStore(clock), clock)


def admit(
    q: QuotaManager, tokens: int = 0, cost: float = 0.0, p: Principal | None = None, rid: str = "r"
) -> Admission:
    return run(q.admit(p or who(), tokens, cost, rid))


def rejected(
    q: QuotaManager, tokens: int = 0, cost: float = 0.0, p: Principal | None = None, rid: str = "r"
) -> RateLimitError:
    with pytest.raises(RateLimitError) as info:
        admit(q, tokens, cost, p, rid)
    return info.value


class DownStore:
    """A store whose every call fails as an unreachable Redis would."""

    name = "down"

    def __init__(self) -> None:
        self.calls = 0

    def now(self) -> float:
        return 1_700_000_000.0

    async def run(self, script, keys, args):
        self.calls += 1
        raise StoreUnavailableError("down")

    async def get(self, key):
        raise StoreUnavailableError("down")

    async def set(self, key, value, ttl_s=None):
        raise StoreUnavailableError("down")

    async def delete(self, key):
        raise StoreUnavailableError("down")

    async def aclose(self) -> None:
        pass


# -- windows ------------------------------------------------------------------------------


def test_window_bounds_are_utc_aligned() -> None:
    now = datetime(2024, 12, 31, 23, 59, 30, tzinfo=UTC).timestamp()
    idx, start, end = bounds(Window.MINUTE, now)
    assert (start, end) == (now - 30, now + 30)
    _, start, end = bounds(Window.DAY, now)
    assert start == datetime(2024, 12, 31, tzinfo=UTC).timestamp() and end == now + 30
    mid, start, end = bounds(Window.MONTH, now)
    assert start == datetime(2024, 12, 1, tzinfo=UTC).timestamp()
    assert end == datetime(2025, 1, 1, tzinfo=UTC).timestamp()
    assert bounds(Window.MONTH, end)[0] == mid + 1
    assert bounds(Window.MINUTE, now + 30)[0] == idx + 1
    feb = datetime(2024, 2, 10, tzinfo=UTC).timestamp()
    assert seconds_left(Window.MONTH, feb) == 20 * 86_400  # leap year: Feb has 29 days


@given(st.floats(min_value=0, max_value=4e9), st.sampled_from(list(Window)))
def test_bounds_contain_now(now: float, window: Window) -> None:
    _, start, end = bounds(window, now)
    assert start <= now < end


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0ms"),
        (0.25, "250ms"),
        (0.9994, "1s"),
        (1, "1s"),
        (8.64, "8.64s"),
        (12, "12s"),
        (59.9999, "1m0s"),
        (63, "1m3s"),
        (360, "6m0s"),
        (3723, "1h2m3s"),
        (-5, "0ms"),
    ],
)
def test_reset_format_is_openais(seconds: float, text: str) -> None:
    assert format_reset(seconds) == text


def test_fits_is_inclusive_and_tolerates_float_noise() -> None:
    assert fits(99, 1, 100) and not fits(100, 1, 100)
    assert fits(0.1 + 0.2, 0.7, 1.0)


# -- each limit kind ----------------------------------------------------------------------


def test_rpm_admits_exactly_the_limit_per_minute() -> None:
    clock = FakeClock()
    q = manager(clock, acme=TenantConfig(limits=Limits(rpm=3)))
    for i in range(3):
        assert admit(q, rid=f"r{i}").headers()["x-ratelimit-remaining-requests"] == str(2 - i)
    err = rejected(q)
    assert err.status == 429 and err.retry_after == MINUTE_LEFT
    assert err.headers["x-ratelimit-remaining-requests"] == "0"
    assert err.headers["x-ratelimit-reset-requests"] == "40s"
    assert "requests per minute" in err.message and "'acme'" in err.message
    clock.advance(MINUTE_LEFT - 0.001)
    rejected(q)
    clock.advance(0.001)
    assert admit(q).headers()["x-ratelimit-remaining-requests"] == "2"


def test_tpm_counts_reservations_and_names_oversized_requests() -> None:
    clock = FakeClock()
    q = manager(clock, acme=TenantConfig(limits=Limits(tpm=1000)))
    a = admit(q, 600)
    assert a.headers() == {
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "400",
        "x-ratelimit-reset-tokens": "40s",
    }
    err = rejected(q, 401)
    assert err.headers["x-ratelimit-remaining-tokens"] == "400" and err.retry_after == MINUTE_LEFT
    admit(q, 400)
    too_big = rejected(q, 1001)
    assert "needs 1001" in too_big.message


def test_concurrency_slots_are_released_by_settle_or_lease_expiry() -> None:
    clock = FakeClock()
    q = manager(clock, acme=TenantConfig(limits=Limits(concurrency=2)))
    a = admit(q, rid="a")
    admit(q, rid="b")
    err = rejected(q, rid="c")
    assert err.retry_after == 1.0 and "concurrent requests" in err.message
    assert a.headers() == {}  # OpenAI has no header for concurrency
    run(q.settle(a, 0, 0))
    admit(q, rid="c")
    rejected(q, rid="d")
    clock.advance(q.lease_s)  # a replica that crashed holding b and c: their leases lapse
    admit(q, rid="d")
    admit(q, rid="e")


def test_daily_and_monthly_spend() -> None:
    clock = FakeClock()
    q = manager(clock, acme=TenantConfig(limits=Limits(usd_per_day=1.0, usd_per_month=1.5)))
    admit(q, cost=0.6)
    admit(q, cost=0.4)
    err = rejected(q, cost=0.01)
    assert err.code == "insufficient_quota" and "USD per day" in err.message
    assert err.retry_after == seconds_left(Window.DAY, clock.wall())
    clock.advance(err.retry_after)  # the next UTC day
    admit(q, cost=0.5)
    err = rejected(q, cost=0.01)
    assert "USD per month" in err.message and "USD per day" not in err.message
    assert err.retry_after == seconds_left(Window.MONTH, clock.wall())


# -- reconciliation -----------------------------------------------------------------------


def test_settle_refunds_and_charges_in_the_same_window() -> None:
    clock = FakeClock()
    q = manager(clock, acme=TenantConfig(limits=Limits(tpm=1000, usd_per_day=1.0)))
    a = admit(q, 800, 0.8)
    run(q.settle(a, 100, 0.1))  # used far less than estimated: capacity comes back
    b = admit(q, 900, 0.9)
    assert b.headers()["x-ratelimit-remaining-tokens"] == "0"
    run(q.settle(b, 950, 0.95))  # more than estimated: charged, now over the limit
    err = rejected(q, 0, 0.0)
    assert err.headers["x-ratelimit-remaining-tokens"] == "0"
    assert "tokens per minute" in err.message and "USD per day" in err.message
    assert err.code == "insufficient_quota"


def test_settle_after_the_window_charges_debt_and_drops_refunds() -> None:
    clock = FakeClock()
    q = manager(clock, acme=TenantConfig(limits=Limits(tpm=1000)))
    over = admit(q, 500, rid="over")
    under = admit(q, 500, rid="under")
    clock.advance(MINUTE_LEFT)  # next minute
    run(q.settle(under, 0, 0))  # refund of a finished window: dropped
    assert admit(q, 0).headers()["x-ratelimit-remaining-tokens"] == "1000"
    run(q.settle(over, 800, 0))  # 300 more than reserved: debt on the current window
    assert admit(q, 0).headers()["x-ratelimit-remaining-tokens"] == "700"


def test_settle_is_idempotent_and_never_raises() -> None:
    clock = FakeClock()
    q = manager(clock, acme=TenantConfig(limits=Limits(tpm=1000, concurrency=1)))
    a = admit(q, 100, rid="a")
    run(q.settle(a, 400, 0))
    run(q.settle(a, 400, 0))
    b = admit(q, 0, rid="b")
    assert b.headers()["x-ratelimit-remaining-tokens"] == "600"
    run(q.settle(a, 0, 0))  # a's lease was released once; b's slot must stay held
    rejected(q, rid="c")
    broken = Admission("x", "acme", None, store=DownStore(), checks=b.checks, used=b.used)
    run(q.settle(broken, 1, 0))
    assert q.settle_failures == 1 and broken.settled


# -- scopes -------------------------------------------------------------------------------


def test_key_limits_apply_to_each_key_and_the_tenant_limit_to_all() -> None:
    clock = FakeClock()
    cfg = TenantConfig(limits=Limits(rpm=5, tpm=10_000), key_limits=Limits(rpm=2))
    q = manager(clock, acme=cfg)
    first = admit(q, p=who(key="a"))
    # the key's limit is the tighter one: 1 left of 2 (the tenant has 4 left of 5)
    assert first.headers()["x-ratelimit-remaining-requests"] == "1"
    assert first.headers()["x-ratelimit-limit-requests"] == "2"
    assert first.headers()["x-ratelimit-remaining-tokens"] == "10000"
    admit(q, p=who(key="a"))
    err = rejected(q, p=who(key="a"))
    assert "key 'a'" in err.message
    admit(q, p=who(key="b"))
    admit(q, p=who(key="b"))
    admit(q, p=who(key="c"))  # the tenant's fifth
    err = rejected(q, p=who(key="d"))
    assert "tenant 'acme'" in err.message and "key" not in err.message.split(":")[1]


def test_admission_is_all_or_nothing() -> None:
    clock = FakeClock()
    cfg = TenantConfig(limits=Limits(tpm=1000), key_limits=Limits(rpm=1))
    q = manager(clock, acme=cfg)
    admit(q, 100, p=who(key="a"))
    rejected(q, 100, p=who(key="a"))  # the key's RPM refuses: no tokens reserved for it
    assert admit(q, 0, p=who(key="b")).headers()["x-ratelimit-remaining-tokens"] == "900"


def test_tenants_are_independent() -> None:
    clock = FakeClock()
    q = manager(
        clock, acme=TenantConfig(limits=Limits(rpm=1)), beta=TenantConfig(limits=Limits(rpm=1))
    )
    admit(q, p=who("acme"))
    admit(q, p=who("beta"))
    rejected(q, p=who("acme"))


def test_unlimited_principals_touch_no_store() -> None:
    clock, down = FakeClock(), DownStore()
    q = manager(
        clock,
        fallback=down,
        store=down,
        acme=TenantConfig(),
        beta=TenantConfig(limits=Limits(rpm=1)),
    )
    for principal in (OPEN, ADMIN, who("acme"), who("unknown")):
        a = admit(q, 10, 1.0, p=principal)
        assert a.headers() == {} and a.store is None and not a.degraded
        run(q.settle(a, 10, 1.0))
    assert down.calls == 0


# -- store failures -----------------------------------------------------------------------


def test_fail_open_uses_local_limits_and_counts_it() -> None:
    clock = FakeClock()
    down, local = DownStore(), MemoryStore(clock)
    q = manager(
        clock, fallback=local, store=down, acme=TenantConfig(limits=Limits(rpm=2, concurrency=1))
    )
    a = admit(q, rid="a")
    assert a.degraded and a.store is local and q.degraded_admissions == 1
    assert a.headers()["x-ratelimit-remaining-requests"] == "1"
    rejected(q, rid="b")  # the local concurrency limit holds
    run(q.settle(a, 0, 0))  # settles where it was admitted
    admit(q, rid="b")
    rejected(q, rid="c")  # the local RPM limit too


def test_fail_closed_answers_503_and_a_dead_fallback_too() -> None:
    clock = FakeClock()
    closed = TenantConfig(limits=Limits(rpm=2), on_store_failure="closed")
    q = manager(clock, fallback=MemoryStore(clock), store=DownStore(), acme=closed)
    with pytest.raises(ServiceUnavailableError) as info:
        admit(q)
    assert info.value.status == 503 and info.value.retry_after == 1.0
    q = manager(
        clock, fallback=DownStore(), store=DownStore(), acme=TenantConfig(limits=Limits(rpm=2))
    )
    with pytest.raises(ServiceUnavailableError):
        admit(q)
    assert q.unavailable_rejections == 1 and q.degraded_admissions == 1


# -- invariants ---------------------------------------------------------------------------

RPM, TPM = 7, 1000

# One arrival: gap since the previous one (s), estimated tokens, actual/estimate ratio,
# seconds until settle (None: never settled, e.g. still streaming or crashed).
arrival = st.tuples(
    st.floats(0, 25),
    st.integers(0, 600),
    st.floats(0, 2),
    st.one_of(st.none(), st.floats(0, 150)),
)


def _simulate(arrivals, cap_actual: bool):
    """Replay arrivals and settles in time order on a memory-store QuotaManager. Returns the
    manager's decisions alongside an independent model of what each window was charged."""
    clock = FakeClock()
    q = manager(clock, acme=TenantConfig(limits=Limits(rpm=RPM, tpm=TPM)))
    events, t = [], 0.0
    for i, (gap, est, ratio, delay) in enumerate(arrivals):
        t += gap
        actual = int(est * min(ratio, 1.0) if cap_actual else est * ratio)
        events.append((t, 1, i, est, actual))
        if delay is not None:
            events.append((t + delay, 0, i, est, actual))
    events.sort()
    start = clock.now()
    return q, clock, start, events


@settings(max_examples=150, deadline=None)
@given(st.lists(arrival, max_size=40))
def test_admitted_per_window_never_exceeds_rpm_or_tpm(arrivals) -> None:
    """Estimates are upper bounds here; a settle in the admission's window lowers its charge
    to the actual count. Per window: admissions <= RPM and charged tokens <= TPM, and every
    refusal was needed (the request really did not fit)."""
    q, clock, start, events = _simulate(arrivals, cap_actual=True)
    admitted: dict[int, tuple[Admission, int, int]] = {}  # i -> admission, window, charge
    for at, is_admit, i, est, actual in events:
        clock.advance(start + at - clock.now())
        window = bounds(Window.MINUTE, clock.wall())[0]
        if not is_admit:
            if i in admitted:
                adm, w, _ = admitted[i]
                run(q.settle(adm, actual, 0.0))
                if w == window:
                    admitted[i] = (adm, w, actual)
            continue
        mine = [charge for _, w, charge in admitted.values() if w == window]
        try:
            admitted[i] = (admit(q, est, rid=str(i)), window, est)
        except RateLimitError:
            assert len(mine) + 1 > RPM or sum(mine) + est > TPM
    for w in {w for _, w, _ in admitted.values()}:
        charges = [c for _, ww, c in admitted.values() if ww == w]
        assert len(charges) <= RPM and sum(charges) <= TPM


@settings(max_examples=150, deadline=None)
@given(st.lists(arrival, max_size=40))
def test_counters_follow_the_settle_rules_with_any_actual_usage(arrivals) -> None:
    """Actual usage may exceed estimates. A model of the documented rules (refund in the
    same window, debt charged to the current window, late refunds dropped) predicts every
    decision and every x-ratelimit-remaining-tokens; an admission never leaves its window's
    counter above TPM."""
    q, clock, start, events = _simulate(arrivals, cap_actual=False)
    counter: dict[int, int] = {}
    requests: dict[int, int] = {}
    held: dict[int, tuple[Admission, int]] = {}
    for at, is_admit, i, est, actual in events:
        clock.advance(start + at - clock.now())
        window = bounds(Window.MINUTE, clock.wall())[0]
        if not is_admit:
            if i in held:
                adm, w = held.pop(i)
                run(q.settle(adm, actual, 0.0))
                delta = actual - est
                if w == window:
                    counter[w] = max(0, counter[w] + delta)
                elif delta > 0:
                    counter[window] = counter.get(window, 0) + delta
            continue
        used, count = counter.get(window, 0), requests.get(window, 0)
        should = count + 1 <= RPM and used + est <= TPM
        try:
            adm = admit(q, est, rid=str(i))
        except RateLimitError:
            assert not should
            continue
        assert should
        counter[window], requests[window] = used + est, count + 1
        held[i] = (adm, window)
        assert counter[window] <= TPM
        assert adm.headers()["x-ratelimit-remaining-tokens"] == str(TPM - counter[window])


def test_non_finite_or_negative_costs_reserve_nothing() -> None:
    clock = FakeClock()
    q = manager(clock, acme=TenantConfig(limits=Limits(usd_per_day=1.0)))
    for i, cost in enumerate((float("nan"), float("inf"), -3.0)):
        run(q.settle(admit(q, cost=cost, rid=str(i)), 0, cost))
    admit(q, cost=1.0)
    rejected(q, cost=0.01)
