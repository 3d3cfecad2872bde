"""Upstream Retry-After values (issue 10, defect 6): parsed within bounds, never waited on
beyond ``max_retry_after_s``, and capped at ``max_client_retry_after_s`` for the client."""

from __future__ import annotations

import email.utils

import httpx
import pytest

from core.config import RoutingConfig
from core.errors import (
    AllTargetsFailedError,
    GatewayError,
    UpstreamConnectError,
    UpstreamRateLimitedError,
    UpstreamServerError,
)
from gateway.http.errors import error_headers
from providers.http import MAX_RETRY_AFTER_S, parse_retry_after
from routers.executor import Executor
from routers.trace import Trace
from tests.unit.test_executor import Scripted, Sleeps, target

pytestmark = pytest.mark.anyio
NOW = 1_700_000_000.0


def retry_after(value: str, header: str = "retry-after") -> float | None:
    return parse_retry_after(httpx.Headers({header: value}), now=NOW)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "soon", ""])
def test_unusable_values_are_ignored(value: str) -> None:
    assert retry_after(value) is None


@pytest.mark.parametrize(
    "value",
    ["999999", "1e300", email.utils.formatdate(NOW + 10 * 365 * 86400, usegmt=True)],
)
def test_absurd_waits_are_clamped(value: str) -> None:
    assert retry_after(value) == MAX_RETRY_AFTER_S


def test_unusable_milliseconds_fall_back_to_the_seconds_header() -> None:
    headers = httpx.Headers({"retry-after-ms": "nan", "retry-after": "3"})
    assert parse_retry_after(headers) == 3.0
    assert retry_after("1e400", "retry-after-ms") is None


def test_a_date_beyond_what_a_datetime_holds_is_ignored() -> None:
    assert retry_after("Fri, 31 Dec 99999 23:59:59 GMT") is None


def executor(sleeps: Sleeps, **config: float) -> Executor:
    settings = RoutingConfig(max_attempts_per_target=3, retry_backoff_s=0.1, **config)
    return Executor(settings, sleep=sleeps, jitter=lambda: 0.5)


async def call(ex: Executor, *providers: Scripted) -> str:
    plan = [target(p) for p in providers]
    result: str = await ex.call("alias", plan, lambda t: t.provider.chat(None, None), Trace())
    return result


async def test_the_client_is_told_at_most_max_client_retry_after() -> None:
    sleeps = Sleeps()
    a = Scripted("a", [UpstreamRateLimitedError("x", retry_after=MAX_RETRY_AFTER_S)])
    b = Scripted("b", [UpstreamRateLimitedError("y", retry_after=999_999.0)])
    with pytest.raises(AllTargetsFailedError) as info:
        await call(executor(sleeps, max_client_retry_after_s=45), a, b)
    assert info.value.status == 429 and info.value.retry_after == 45
    assert error_headers(info.value, "req_1")["retry-after"] == "45"
    assert sleeps == [] and a.calls == b.calls == 1  # neither was waited on


async def test_short_waits_are_passed_on_unchanged() -> None:
    a = Scripted("a", [UpstreamRateLimitedError("x", retry_after=7.2)])
    with pytest.raises(AllTargetsFailedError) as info:
        await call(executor(Sleeps(), max_retry_after_s=1), a)
    assert error_headers(info.value, None)["retry-after"] == "8"


async def test_a_retryable_error_with_a_long_wait_is_not_waited_on() -> None:
    """Retryable errors retry at once by nature, unless the upstream asked for more than
    ``max_retry_after_s``: then the executor moves on instead of sleeping for a day."""
    sleeps = Sleeps()
    a = Scripted("a", [UpstreamConnectError("refused", retry_after=MAX_RETRY_AFTER_S)])
    b = Scripted("b", ["ok"])
    assert await call(executor(sleeps), a, b) == "b:ok"
    assert sleeps == [] and a.calls == 1


async def test_a_wait_within_the_limit_is_slept_once_then_retried() -> None:
    sleeps = Sleeps()
    a = Scripted("a", [UpstreamServerError("busy", retry_after=1.5), "ok"])
    assert await call(executor(sleeps, max_retry_after_s=2), a) == "a:ok"
    assert sleeps == [1.5]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_retry_after_never_breaks_the_error_path(value: float) -> None:
    error = GatewayError("x", retry_after=value)
    assert "retry-after" not in error_headers(error, "req_1")
