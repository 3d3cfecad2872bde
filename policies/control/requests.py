"""What an admin asks the control plane to do (the admin API's bodies, also built by the
CLI), and what a change is checked against (``Catalog``)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from core.config_tenants import Limits, TenantConfig

Name = Annotated[str, Meta(min_length=1, max_length=200)]
TenantName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
# Unix seconds, or an RFC 3339 time with its offset ("2026-01-31T00:00:00Z")
When = float | Annotated[datetime, Meta(tz=True)]
Models = Annotated[list[Annotated[str, Meta(min_length=1)]], Meta(min_length=1)]
MAX_GRACE_S = 30 * 86400.0
DEFAULT_GRACE_S = 3600.0


class _Body(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    pass


class CreateKey(_Body, frozen=True):
    """``POST /admin/keys``. ``allowed_models`` None: every model the tenant may use.
    ``limits`` None: the tenant's ``key_limits`` apply to this key; set: these instead."""

    tenant: Annotated[str, Meta(min_length=1)]
    name: Name = "default"
    allowed_models: Models | None = None
    expires_at: When | None = None
    metadata: dict[str, str] = {}
    limits: Limits | None = None


class UpdateKey(_Body, frozen=True):
    """``PATCH /admin/keys/{id}``: only the fields given change; ``null`` clears
    ``allowed_models`` (every model), ``expires_at`` (never) and ``limits`` (the tenant's
    ``key_limits`` again). ``limits`` given replaces the key's limits as a whole."""

    name: Name | UnsetType = UNSET
    allowed_models: Models | UnsetType | None = UNSET
    expires_at: When | UnsetType | None = UNSET
    metadata: dict[str, str] | UnsetType = UNSET
    limits: Limits | UnsetType | None = UNSET

    def changes(self) -> dict[str, Any]:
        """The fields given, times as Unix seconds."""
        given = {
            name: getattr(self, name)
            for name in self.__struct_fields__
            if getattr(self, name) is not UNSET
        }
        if "expires_at" in given:
            given["expires_at"] = unix(given["expires_at"])
        return given


class RotateKey(_Body, frozen=True):
    """``POST /admin/keys/{id}/rotate``: how long the replaced secret keeps working."""

    grace_seconds: Annotated[float, Meta(ge=0, le=MAX_GRACE_S)] = DEFAULT_GRACE_S


def unix(when: float | datetime | None) -> float | None:
    """``when`` as Unix seconds."""
    return when.timestamp() if isinstance(when, datetime) else when


class Catalog(Struct, frozen=True, kw_only=True):
    """What a change may refer to: the tenants in force (the policy file's merged with the
    API's), the model aliases and the providers configured."""

    tenants: Mapping[str, TenantConfig]
    models: frozenset[str]
    providers: frozenset[str]

    def tenant_problems(self, config: TenantConfig) -> list[str]:
        """References in a tenant's settings to aliases or providers that do not exist."""
        problems = []
        for field in ("models", "deny_models"):
            for alias in getattr(config, field) or ():
                if alias not in self.models:
                    problems.append(f"{field}: unknown model alias '{alias}'")
        for field in ("providers", "deny_providers"):
            for provider in getattr(config, field) or ():
                if provider not in self.providers:
                    problems.append(f"{field}: unknown provider '{provider}'")
        return problems


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396 JSON merge patch: objects merge key by key, ``null`` removes a key (back to
    its default), anything else replaces."""
    if not isinstance(patch, Mapping):
        return patch
    merged = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def tenant_fields(raw: Mapping[str, Any], base: TenantConfig | None = None) -> TenantConfig:
    """``raw`` (a tenant's fields, as in the policy file) merged over ``base`` (a PATCH,
    RFC 7396) or over the defaults; ``msgspec.ValidationError`` names the wrong field."""
    start = msgspec.to_builtins(base) if base is not None else {}
    return msgspec.convert(merge_patch(start, raw), TenantConfig)
