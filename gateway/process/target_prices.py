"""A target's price and context window: its config first, then the shipped price map.

``resolve_target_price`` is what the runtime snapshot calls for every configured target.
A managed target left with no price at all costs 0 in the ledger and looks free to
cost-aware routing, so it is logged as a warning every time a snapshot is built (start and
each reload).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import structlog

from core.config import (
    AnthropicProviderConfig,
    GeminiProviderConfig,
    OpenAIProviderConfig,
    ProviderConfig,
    TargetConfig,
)
from core.config_tenants import Price
from policies.price_map import PriceMap, Vendor, shipped_price_map

_log = structlog.get_logger("switchyard")
OPENAI_HOST = "api.openai.com"


def vendor_of(config: ProviderConfig) -> Vendor | None:
    """The vendor whose list prices apply to ``config``'s models: Anthropic's and Google's
    wire formats are theirs alone; an OpenAI-compatible provider is OpenAI only at OpenAI's
    own host (elsewhere the same names may be another company's, at another price)."""
    if isinstance(config, AnthropicProviderConfig):
        return "anthropic"
    if isinstance(config, GeminiProviderConfig):
        return "gemini"
    if type(config) is OpenAIProviderConfig and urlsplit(config.base_url).hostname == OPENAI_HOST:
        return "openai"
    return None


def resolve_target_price(
    alias: str,
    entry: TargetConfig,
    provider: ProviderConfig,
    reported_context: int | None,
    prices: PriceMap | None = None,
) -> tuple[Price | None, int | None]:
    """(price, max_context) for one target. Price: ``entry.price``, else the map's for its
    vendor and model. Context: ``entry.max_context``, else what the provider reports, else
    the map's. Warns when a non-local target ends up with no price."""
    vendor = vendor_of(provider)
    found = (prices or shipped_price_map()).lookup(vendor, entry.model) if vendor else None
    price = entry.price or (found.price() if found else None)
    context = entry.max_context or reported_context or (found.context if found else None)
    if price is None and not provider.local:
        _log.warning(
            "pricing.unknown_model",
            alias=alias,
            provider=entry.provider,
            model=entry.model,
            detail="no price in the config or the shipped price map: priced 0",
        )
    return price, context
