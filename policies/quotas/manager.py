"""Tenant quotas: RPM, TPM, concurrency, USD per UTC day and month, per tenant and per key.

A key's limits are its tenant's ``key_limits``, or, when the principal carries limits of
its own (``Principal.limits``, a control-plane key's), those instead; either way they count
on the same counters (keyed by the key id), so a key moved from one to the other keeps
what it used in the current windows. The tenant's ``limits`` apply on top.

One ``admit`` = one ADMIT script (one EVALSHA on Redis) that checks and reserves every limit
of the tenant and of the calling key, all or nothing. One ``settle`` = one SETTLE script
that reconciles the reservation with real usage and releases the concurrency lease.

Accounting rules (see ``windows`` for why windows are fixed and UTC-aligned):

- RPM counts admissions. TPM and spend reserve the caller's estimate at admission; an
  admission succeeds only if every counter stays within its limit, so *what is charged to a
  window at admission never takes it past its limit*: with no settles (or exact estimates)
  requests per window <= RPM and tokens per window <= TPM.
- ``settle`` moves the counter of the window the reservation was made in by
  ``actual - estimate`` while that window is current (a refund frees capacity in it). Once
  that window is over, an underestimate is charged to the current window as debt (so
  systematic underestimates cannot beat the limit over time) and a refund is dropped (it
  cannot free capacity in a window it was never charged to).
- Spend bound: the spend charged to one UTC day (or month) is at most
  budget + the sum, over requests settled into it, of max(0, actual - estimate). Each
  admission leaves the counter <= budget; only underestimates settled afterwards push it
  past, by exactly their excess.
- Concurrency: a lease per request id that expires after ``lease_s`` (default 10 min), so a
  crashed replica's slots come back by themselves; a request running longer than
  ``lease_s`` stops counting towards the limit.

Store failures: a tenant with ``on_store_failure: open`` is checked against the same limits on
``fallback`` (this replica's own memory store, i.e. per-replica local limits: during an
outage N replicas admit up to N times the limit), counted in ``degraded_admissions`` and
logged (at most every ``log_every_s``). ``closed`` answers 503 ``ServiceUnavailableError``.
Principals without a tenant (open gateway, admin) are not limited and touch no store; nor
are unknown tenants, except by a key's own limits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from core.clock import Clock
from core.config_tenants import Limits, TenantConfig
from core.errors import ServiceUnavailableError
from core.tenancy import Principal
from policies.quotas.checks import (
    Check,
    TenantPlan,
    key_for,
    own_key_specs,
    plan_for,
    ratelimit_headers,
    rejection,
    ttl_for,
)
from policies.quotas.releases import PendingReleases
from policies.quotas.scripts import ADMIT, PEEK, SETTLE
from policies.quotas.windows import bounds
from policies.store.base import Store, StoreUnavailableError, Value
from policies.store.memory import MemoryStore

_log = structlog.get_logger("switchyard.quotas")


def _lease_keys(checks: tuple[Check, ...]) -> list[str]:
    return [c.key for c in checks if c.spec.kind == "c"]


def _usd(value: float) -> float:
    """Costs as counters accept them: negative, NaN or infinite estimates count as 0
    (Redis' INCRBYFLOAT refuses non-finite numbers, and the contract is "no other errors")."""
    return value if math.isfinite(value) and value > 0 else 0.0


@dataclass(slots=True, eq=False)
class Admission:
    """What ``admit`` reserved, to be handed back to ``settle``.
    ``degraded``: decided on the fallback store (shared store unreachable)."""

    request_id: str
    tenant: str | None = None
    key_id: str | None = None
    degraded: bool = False
    store: Store | None = None  # where the reservation lives; None: nothing reserved
    checks: tuple[Check, ...] = ()
    used: tuple[float, ...] = ()
    at: float = 0.0  # the store's wall time at admission
    settled: bool = False

    def headers(self) -> dict[str, str]:
        """x-ratelimit-{limit,remaining,reset}-{requests,tokens} after this reservation;
        empty when nothing limits the principal's requests or tokens."""
        return ratelimit_headers(self.checks, self.used, self.at)


@dataclass(frozen=True, slots=True)
class _Ask:
    """One admission request, sanitised."""

    tenant: str
    key_id: str | None
    limits: Limits | None  # the key's own; None: the tenant's key_limits
    tokens: int
    cost: float
    request_id: str


class QuotaManager:
    """Admission control and usage reconciliation (see the module docstring)."""

    def __init__(
        self,
        tenants: Mapping[str, TenantConfig],
        store: Store,
        fallback: Store,
        clock: Clock,
        *,
        lease_s: float = 600.0,
        unavailable_retry_after_s: float = 1.0,
        log_every_s: float = 10.0,
        releases: PendingReleases | None = None,
    ) -> None:
        self.store = store
        self.fallback = fallback
        self.clock = clock
        self.lease_s = lease_s
        self.unavailable_retry_after_s = unavailable_retry_after_s
        self.log_every_s = log_every_s
        # Leases a failed settle could not release; shared across reloads by the caller.
        self.releases = releases if releases is not None else PendingReleases()
        self._plans = {name: plan_for(name, cfg) for name, cfg in tenants.items()}
        self._logged_at: float | None = None
        self.degraded_admissions = 0  # admissions decided on the fallback store
        self.unavailable_rejections = 0  # 503s for fail-closed tenants
        self.settle_failures = 0  # settles lost to store errors (logged)

    def _plan(self, tenant: str | None, key_limits: Limits | None) -> TenantPlan | None:
        """The tenant's plan; for a tenant this manager does not know, a bare one when the
        key has limits of its own (they apply whatever the tenant), else None."""
        if tenant is None:
            return None
        plan = self._plans.get(tenant)
        if plan is None and key_limits is not None:
            plan = plan_for(tenant, TenantConfig())
        return plan

    def _checks(
        self,
        plan: TenantPlan,
        key_id: str | None,
        key_limits: Limits | None,
        tokens: int,
        cost: float,
        now: float,
    ) -> tuple[Check, ...]:
        amounts = {
            "requests": 1.0,
            "tokens": float(tokens),
            "concurrency": 1.0,
            "usd_day": cost,
            "usd_month": cost,
        }
        out = [
            Check(s, key_for(s, plan.base + ":t", now), amounts[s.metric])
            for s in plan.tenant_specs
        ]
        key_specs = plan.key_specs if key_limits is None else own_key_specs(key_limits)
        if key_id is not None and key_specs:
            base = f"{plan.base}:k:{key_id}"
            out += [Check(s, key_for(s, base, now), amounts[s.metric]) for s in key_specs]
        return tuple(out)

    def admits_without_io(self, principal: Principal) -> bool:
        """True when ``admit`` for ``principal`` never waits on I/O: the principal has no
        limits here, or the store is this process's memory store (whose scripts run
        without awaiting anything)."""
        plan = self._plan(principal.tenant, principal.limits)
        return plan is None or isinstance(self.store, MemoryStore)

    async def admit(
        self, principal: Principal, est_tokens: int, est_cost_usd: float, request_id: str
    ) -> Admission:
        """Reserve ``est_tokens`` and ``est_cost_usd`` against every limit of the tenant and
        of the key, all or nothing. Raises ``RateLimitError`` (429, ``retry_after`` and
        x-ratelimit-* ``headers`` set) when a limit would be exceeded, and
        ``ServiceUnavailableError`` (503) when the store is down and the tenant fails
        closed (or the fallback fails too). Raises nothing else."""
        tenant = principal.tenant
        plan = self._plan(tenant, principal.limits)
        if plan is None or tenant is None:
            return Admission(request_id, tenant, principal.key_id)
        ask = _Ask(
            tenant,
            principal.key_id,
            principal.limits,
            max(0, est_tokens),
            _usd(est_cost_usd),
            request_id,
        )
        try:
            return await self._admit_on(self.store, plan, ask, degraded=False)
        except StoreUnavailableError as exc:
            if plan.on_failure == "closed" or self.fallback is self.store:
                self.unavailable_rejections += 1
                raise self._unavailable(tenant) from exc
            self._note_degraded(tenant, exc)
        try:
            return await self._admit_on(self.fallback, plan, ask, degraded=True)
        except StoreUnavailableError as exc:
            self.unavailable_rejections += 1
            raise self._unavailable(tenant) from exc

    async def _admit_on(
        self, store: Store, plan: TenantPlan, ask: _Ask, *, degraded: bool
    ) -> Admission:
        now = store.now()
        checks = self._checks(plan, ask.key_id, ask.limits, ask.tokens, ask.cost, now)
        if not checks:
            return Admission(ask.request_id, ask.tenant, ask.key_id, degraded)
        args: list[Value] = [now, ask.request_id]
        for check in checks:
            spec = check.spec
            amount: Value = int(check.amount) if spec.kind == "n" else repr(check.amount)
            args += [spec.kind, repr(spec.limit), amount, repr(ttl_for(spec, now, self.lease_s))]
        try:
            reply = await store.run(ADMIT, [c.key for c in checks], args)
        except StoreUnavailableError:
            # A timed-out ADMIT may still run when the store wakes up (a hung Redis
            # executes what it had buffered): release its lease too, idempotently.
            self.releases.add(store, ask.request_id, _lease_keys(checks))
            raise
        used = tuple(float(u) for u in reply[1:])
        if int(reply[0]) != 1:
            raise rejection(checks, used, now, ask.tenant, ask.key_id)
        return Admission(ask.request_id, ask.tenant, ask.key_id, degraded, store, checks, used, now)

    def _unavailable(self, tenant: str) -> ServiceUnavailableError:
        error = ServiceUnavailableError(
            f"Quota state for tenant {tenant!r} is unavailable; try again shortly.",
            retry_after=self.unavailable_retry_after_s,
        )
        error.refused_by = "quota:store_down"
        return error

    def _note_degraded(self, tenant: str, exc: Exception) -> None:
        self.degraded_admissions += 1
        now = self.clock.now()
        if self._logged_at is None or now - self._logged_at >= self.log_every_s:
            self._logged_at = now
            _log.warning(
                "quota.store_unavailable",
                tenant=tenant,
                fallback="local limits",
                error=str(exc),
                degraded_admissions=self.degraded_admissions,
            )

    async def current(
        self, tenant: str, key_id: str | None = None, key_limits: Limits | None = None
    ) -> list[dict[str, Any]]:
        """The tenant's (and, with ``key_id``, that key's) use of each of its limits right
        now, read from the shared store without changing it: one entry per limit with
        ``scope``, ``metric``, ``limit`` and ``used`` (live leases for concurrency; the
        current window's counter otherwise). ``key_limits``: the key's own limits, if it
        has any (else the tenant's ``key_limits`` are shown). Empty for an unknown or
        unlimited tenant. Raises ``StoreUnavailableError`` when the store is down."""
        plan = self._plan(tenant, key_limits)
        if plan is None:
            return []
        now = self.store.now()
        checks = self._checks(plan, key_id, key_limits, 0, 0.0, now)
        if not checks:
            return []
        reply = await self.store.run(
            PEEK, [c.key for c in checks], [now, *(c.spec.kind for c in checks)]
        )
        return [
            {
                "scope": c.spec.scope,
                "metric": c.spec.metric,
                "limit": c.spec.limit,
                "used": float(u if isinstance(u, str) else u.decode()),
            }
            for c, u in zip(checks, reply, strict=True)
        ]

    async def settle(self, admission: Admission, tokens: int, cost_usd: float) -> None:
        """Reconcile the reservation with real usage (``tokens`` = prompt + completion,
        ``cost_usd``) and release the concurrency lease, on the store that admitted.
        Idempotent: only the first call counts. Never raises; store errors are logged and
        counted, and the concurrency lease is queued in ``releases`` to be released when the
        store answers again (``PendingReleases.retry``)."""
        store = admission.store
        if admission.settled or store is None:
            return
        admission.settled = True  # before awaiting: a concurrent second call is a no-op
        actual = {
            "tokens": float(max(0, tokens)),
            "usd_day": _usd(cost_usd),
            "usd_month": _usd(cost_usd),
        }
        try:
            keys, args = self._settle_args(admission, store.now(), actual)
            if keys:
                await store.run(SETTLE, keys, args)
        except Exception as exc:  # settle must never fail the request it belongs to
            self.settle_failures += 1
            leases = _lease_keys(admission.checks)
            self.releases.add(store, admission.request_id, leases)
            _log.warning(
                "quota.settle_failed",
                tenant=admission.tenant,
                request_id=admission.request_id,
                error=repr(exc),
                lease_release="retried" if leases else "none",
            )

    async def charge(self, principal: Principal, tokens: int, cost_usd: float, ref: str) -> None:
        """Add usage that ran without an admission here (a provider's batch API answered
        it) to the token and spend counters of the current windows of ``principal``'s
        tenant and key: never refused, it makes later requests meet their limits sooner.
        Requests and concurrency are not counted (none ran through the gateway). ``ref``
        names the charge in logs. Never raises, like ``settle``."""
        plan = self._plan(principal.tenant, principal.limits)
        if plan is None:
            return
        now = self.store.now()
        checks = self._checks(plan, principal.key_id, principal.limits, 0, 0.0, now)
        counted = tuple(c for c in checks if c.spec.kind != "c")
        held = Admission(ref, principal.tenant, principal.key_id, False, self.store, counted)
        await self.settle(held, tokens, cost_usd)  # reserved 0: the whole usage is the delta

    def _settle_args(
        self, admission: Admission, now: float, actual: dict[str, float]
    ) -> tuple[list[str], list[Value]]:
        keys: list[str] = []
        args: list[Value] = [admission.request_id]
        for check in admission.checks:
            spec = check.spec
            if spec.kind == "c":
                keys += [check.key, check.key]
                args += ["c", 0, 0]
                continue
            if spec.metric not in actual or spec.window is None:
                continue  # requests: one per admission, nothing to reconcile
            delta = actual[spec.metric] - check.amount
            if delta == 0:
                continue
            current = check.key.rsplit(":", 1)[0] + f":{bounds(spec.window, now)[0]}"
            keys += [check.key, current]
            args += [
                spec.kind,
                int(delta) if spec.kind == "n" else repr(delta),
                repr(ttl_for(spec, now, self.lease_s)),
            ]
        return keys, args
