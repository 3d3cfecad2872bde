"""The pieces one request's quota checks are made of: which limits apply (``Spec``), their
keys and TTLs in the store (``Check``), the x-ratelimit-* headers and the 429 a rejection
becomes. Pure: no I/O, no clock reads (times are passed in)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from core.config_tenants import FailureMode, Limits, TenantConfig
from core.errors import RateLimitError
from policies.quotas.windows import Window, bounds, fits, format_reset, remaining, seconds_left

WINDOW_SLACK_S = 60.0  # counters outlive their window a little: replicas' clocks differ
_SPEND = ("usd_day", "usd_month")
_LABELS = {
    "requests": "requests per minute",
    "tokens": "tokens per minute",
    "concurrency": "concurrent requests",
    "usd_day": "USD per day",
    "usd_month": "USD per month",
}


@dataclass(frozen=True, slots=True)
class Spec:
    """One configured limit of one scope."""

    metric: str  # requests | tokens | concurrency | usd_day | usd_month
    scope: str  # tenant | key
    limit: float
    kind: str  # n: int window counter, f: float window counter, c: lease set
    window: Window | None


@dataclass(frozen=True, slots=True)
class Check:
    """A spec bound to one request: its key (window included) and the amount reserved."""

    spec: Spec
    key: str
    amount: float


def specs_for(limits: Limits, scope: str) -> tuple[Spec, ...]:
    """The limits that are set, in a fixed order."""
    out: list[Spec] = []
    if limits.rpm is not None:
        out.append(Spec("requests", scope, limits.rpm, "n", Window.MINUTE))
    if limits.tpm is not None:
        out.append(Spec("tokens", scope, limits.tpm, "n", Window.MINUTE))
    if limits.concurrency is not None:
        out.append(Spec("concurrency", scope, limits.concurrency, "c", None))
    if limits.usd_per_day is not None:
        out.append(Spec("usd_day", scope, limits.usd_per_day, "f", Window.DAY))
    if limits.usd_per_month is not None:
        out.append(Spec("usd_month", scope, limits.usd_per_month, "f", Window.MONTH))
    return tuple(out)


@lru_cache(maxsize=4096)
def own_key_specs(limits: Limits) -> tuple[Spec, ...]:
    """The specs of a key's own limits (``Principal.limits``), computed once per distinct
    ``Limits`` value (they are frozen and hashable), not once per request."""
    return specs_for(limits, "key")


def key_for(spec: Spec, base: str, now: float) -> str:
    """``base`` is ``quota:{tenant}:t`` or ``quota:{tenant}:k:<key id>``; the braces make
    every key of a tenant one Redis Cluster hash slot, so one script may touch them all."""
    if spec.window is None:
        return f"{base}:{spec.metric}"
    return f"{base}:{spec.metric}:{bounds(spec.window, now)[0]}"


def ttl_for(spec: Spec, now: float, lease_s: float) -> float:
    if spec.window is None:
        return lease_s
    return seconds_left(spec.window, now) + WINDOW_SLACK_S


def ratelimit_headers(checks: Sequence[Check], used: Sequence[float], now: float) -> dict[str, str]:
    """OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens}, from the tightest of
    the tenant's and the key's limits (the one with least remaining)."""
    headers: dict[str, str] = {}
    for metric in ("requests", "tokens"):
        found = [
            (remaining(u, c.spec.limit), c)
            for c, u in zip(checks, used, strict=True)
            if c.spec.metric == metric
        ]
        if not found:
            continue
        left, check = min(found, key=lambda pair: pair[0])
        headers[f"x-ratelimit-limit-{metric}"] = str(int(check.spec.limit))
        headers[f"x-ratelimit-remaining-{metric}"] = str(int(left))
        headers[f"x-ratelimit-reset-{metric}"] = format_reset(seconds_left(Window.MINUTE, now))
    return headers


@dataclass(frozen=True, slots=True)
class TenantPlan:
    """A tenant's limits, computed once per config. ``base`` is the key stem of the
    tenant's counters; the braces make them one Redis Cluster hash slot."""

    base: str
    tenant_specs: tuple[Spec, ...]
    key_specs: tuple[Spec, ...]
    on_failure: FailureMode


def plan_for(name: str, config: TenantConfig) -> TenantPlan:
    """``name``'s plan: its ``limits`` as tenant specs, its ``key_limits`` as the key specs
    of every key without limits of its own."""
    return TenantPlan(
        f"quota:{{{name}}}",
        specs_for(config.limits, "tenant"),
        specs_for(config.key_limits, "key"),
        config.on_store_failure,
    )


# Retry-After for a full concurrency set: slots free when some request ends, which we
# cannot predict; a short wait is the honest answer.
CONCURRENCY_RETRY_S = 1.0


def _retry_after(spec: Spec, now: float) -> float:
    return CONCURRENCY_RETRY_S if spec.window is None else seconds_left(spec.window, now)


def _describe(check: Check, used: float, who: str) -> str:
    spec, label = check.spec, _LABELS[check.spec.metric]
    limit = f"{spec.limit:g}" if spec.kind != "f" else f"{spec.limit:.2f}"
    if check.amount > spec.limit:
        return f"{who}: this request needs {check.amount:g}, more than the {label} limit ({limit})"
    return f"{who}: {label} limit ({limit}) reached"


def rejection(
    checks: Sequence[Check], used: Sequence[float], now: float, tenant: str, key_id: str | None
) -> RateLimitError:
    """The 429 for a refused admission: every limit that did not fit is named, Retry-After
    is the latest of their resets (all must clear), x-ratelimit-* headers are set. Code
    ``insufficient_quota`` (OpenAI's, for spend) when a spend budget is among them."""
    failing = [
        (c, u)
        for c, u in zip(checks, used, strict=True)
        if not fits(u, 1 if c.spec.kind == "c" else c.amount, c.spec.limit)
    ]
    if not failing:  # the store saw state we no longer see: report the tightest limit
        failing = list(zip(checks, used, strict=True))
    names = {"tenant": f"tenant {tenant!r}", "key": f"key {key_id!r} of tenant {tenant!r}"}
    message = "Rate limit reached: " + "; ".join(
        _describe(c, u, names[c.spec.scope]) for c, u in failing
    )
    spend = any(c.spec.metric in _SPEND for c, _ in failing)
    error = RateLimitError(
        message,
        code="insufficient_quota" if spend else None,
        retry_after=max(_retry_after(c.spec, now) for c, _ in failing),
    )
    error.headers.update(ratelimit_headers(checks, used, now))
    error.refused_by = "quota:" + ",".join(sorted({c.spec.metric for c, _ in failing}))
    return error
