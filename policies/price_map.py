"""Default prices and context windows of managed models (``policies/prices/managed.yaml``).

A target without ``price:`` in the config is priced from this map when its provider is one
of the vendors it covers, so cost-aware routing, dollar budgets and the ledger's cost
columns work without hand-typed prices. The map is data with a date and its sources; a
target's own ``price:`` (and ``max_context:``) always wins.

Lookup is exact after removing a dated snapshot suffix (``-2024-08-06``, ``-20250929``) or
``-latest``, so ``gpt-4o-2024-08-06`` is priced as ``gpt-4o`` but ``gpt-4o-mini`` is never
priced as ``gpt-4o``. Pure: the file is read once (``shipped_price_map``) and lookups do no
I/O.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Literal

import msgspec
import yaml

from core.config_tenants import Price

Vendor = Literal["openai", "anthropic", "gemini"]
SHIPPED = Path(__file__).with_name("prices") / "managed.yaml"
_SNAPSHOT_SUFFIX = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


class ModelEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One model's rates (USD per million tokens) and context window (tokens)."""

    input: float
    output: float
    context: int
    cached_input: float | None = None
    also: list[str] = []

    def price(self) -> Price:
        return Price(
            input_per_mtok=self.input,
            output_per_mtok=self.output,
            cached_input_per_mtok=self.cached_input,
        )


class VendorPrices(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    source: str
    models: dict[str, ModelEntry]


class PriceMap(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The whole file: ``as_of`` (the date the rates were read) and rates per vendor."""

    as_of: str
    vendors: dict[Vendor, VendorPrices]

    def lookup(self, vendor: Vendor, model: str) -> ModelEntry | None:
        """The entry for ``model`` at ``vendor`` (snapshot suffix removed), or None."""
        models = self.vendors[vendor].models if vendor in self.vendors else {}
        for name in (model, _SNAPSHOT_SUFFIX.sub("", model)):
            if name in models:
                return models[name]
            for entry in models.values():
                if name in entry.also:
                    return entry
        return None


def load_price_map(path: Path) -> PriceMap:
    """Parse a price map file; raises ``msgspec.ValidationError`` naming the bad field."""
    return msgspec.convert(yaml.safe_load(path.read_text()), PriceMap)


@cache
def shipped_price_map() -> PriceMap:
    """The map shipped with Switchyard (read once per process)."""
    return load_price_map(SHIPPED)
