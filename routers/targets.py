"""Targets: one (provider, upstream model) pair a model alias can be served by."""

from __future__ import annotations

from msgspec import Struct

from core.config_tenants import Price
from core.protocols import Provider, Timeouts


class Target(Struct, frozen=True, kw_only=True):
    """A place a request can go. ``provider`` is the live adapter object; ``local`` marks
    the team's own hardware (data residency); ``max_context`` is in tokens."""

    alias: str
    provider_name: str
    model: str
    provider: Provider
    timeouts: Timeouts
    weight: float = 1.0
    price: Price | None = None
    local: bool = False
    max_context: int | None = None
    replica: str | None = None  # the address of a discovered replica of ``provider_name``

    @property
    def label(self) -> str:
        if self.replica is None:
            return f"{self.provider_name}/{self.model}"
        return f"{self.provider_name}@{self.replica}/{self.model}"


class Skipped(Struct, frozen=True):
    """A target left out of the plan, and why (logged and shown in route reasons)."""

    label: str
    reason: str
