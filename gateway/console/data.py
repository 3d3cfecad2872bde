"""What the console's pages show, gathered from the gateway's own parts: targets and their
health (the same report as ``GET /admin/targets``), tenants with their limits and current
use (``QuotaManager.current``, as ``GET /admin/tenants/{t}/quota``), keys (the control
plane), and the policy serving now."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import yaml

from core.config import Config, ConfigError, load_config
from core.config_tenants import Limits
from gateway.process.reload import Reloader
from gateway.process.state import GatewayState
from gateway.routes.admin import targets_report
from policies.control import public_view
from policies.store.base import StoreUnavailableError

LIMIT_FIELDS = tuple(Limits.__struct_fields__)  # rpm, tpm, concurrency, usd_per_day, ...
MASK = "***"
_SECRET_FIELDS = frozenset({"headers", "dsn"})  # values that may hold credentials


def targets(state: GatewayState) -> dict[str, Any]:
    """The targets report, each target with a ``state`` for its badge: ``open``,
    ``half_open``, ``saturated``, ``starting`` or ``ok``."""
    report = targets_report(state)
    for entry in report["targets"]:
        if entry["breaker"] != "closed":
            entry["state"] = entry["breaker"]
        elif entry["saturated"]:
            entry["state"] = "saturated"
        elif not entry["ready"]:
            entry["state"] = "starting"
        else:
            entry["state"] = "ok"
    return report


class TenantView(msgspec.Struct, kw_only=True):
    """One tenant's row: its limits, each limit's current use (None: the store could not
    be read), where it comes from, its keys (when the control plane is on)."""

    name: str
    source: str
    limits: dict[str, Any]
    key_limits: dict[str, Any]
    models: list[str] | None
    deny_models: list[str]
    use: list[dict[str, Any]] | None
    keys: list[dict[str, Any]]


async def tenant_views(state: GatewayState, only: str | None) -> list[TenantView]:
    """Every tenant in force (or just ``only``), by name, with current use and keys."""
    config = state.runtime.config
    names = sorted(config.tenants) if only is None else [only]
    keys = await _keys_by_tenant(state, only)
    return [await _tenant_view(state, name, keys.get(name, [])) for name in names]


async def _tenant_view(state: GatewayState, name: str, keys: list[dict[str, Any]]) -> TenantView:
    tenant = state.runtime.config.tenants[name]
    control = state.control
    from_api = control is not None and name in control.index.tenants
    try:
        use: list[dict[str, Any]] | None = await state.runtime.quotas.current(name)
    except StoreUnavailableError:
        use = None
    return TenantView(
        name=name,
        source="api" if from_api else "config",
        limits=msgspec.to_builtins(tenant.limits),
        key_limits=msgspec.to_builtins(tenant.key_limits),
        models=tenant.models,
        deny_models=list(tenant.deny_models),
        use=use,
        keys=keys,
    )


async def _keys_by_tenant(state: GatewayState, only: str | None) -> dict[str, list[dict[str, Any]]]:
    control = state.control
    if control is None:
        return {}
    now = state.clock.wall()
    records = await control.plane.list_keys(only)
    found: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        found.setdefault(record.tenant, []).append(public_view(record, now))  # never a hash
    return found


def allowed_aliases(state: GatewayState, tenant: str) -> list[str]:
    """The model aliases ``tenant`` may use (for the key form's choices)."""
    config = state.runtime.config
    rules = config.tenants[tenant]
    allowed = rules.models if rules.models is not None else list(config.models)
    return sorted(a for a in allowed if a in config.models and a not in rules.deny_models)


class PolicyView(msgspec.Struct, kw_only=True):
    """The routing page's policy: the serving policy as YAML (secrets masked), and what
    is known of the file behind it."""

    yaml_text: str
    source: str | None
    file_errors: list[str] | None  # None: not started from a file
    last_reload: float | None
    outcomes: dict[str, int]


async def policy_view(state: GatewayState, reloader: Reloader | None) -> PolicyView:
    """The policy serving now, and whether the file on disk is valid right now (a reload
    would apply it) or not (a reload would be refused; the serving policy stays)."""
    config = state.runtime.config
    errors: list[str] | None = None
    if config.source is not None:
        errors = await asyncio.to_thread(_file_errors, config.source)
    return PolicyView(
        yaml_text=policy_yaml(config),
        source=config.source,
        file_errors=errors,
        last_reload=reloader.last_applied_at if reloader is not None else None,
        outcomes=dict(reloader.outcomes) if reloader is not None else {},
    )


def _file_errors(path: str) -> list[str]:
    try:
        load_config(path)
    except ConfigError as exc:
        return list(exc.errors)
    return []


def policy_yaml(config: Config) -> str:
    """``config`` as YAML, every field (defaults too), with provider headers and DSNs
    masked: they may carry credentials (variable names are shown, never their values)."""
    data = _masked(msgspec.to_builtins(config))
    data.pop("source", None)
    text: str = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=100)
    return text


def _masked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (_mask(v) if k in _SECRET_FIELDS else _masked(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value


def _mask(value: Any) -> Any:
    if isinstance(value, dict):
        return dict.fromkeys(value, MASK)
    return MASK if value else value
