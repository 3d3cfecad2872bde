"""The shipped price map: complete entries, lookups that never confuse two models, and the
runtime's precedence (config price, then the map; a managed target with neither warns)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from core.config import (
    AnthropicProviderConfig,
    GeminiProviderConfig,
    JaxProviderConfig,
    OpenAIProviderConfig,
    TargetConfig,
    VllmProviderConfig,
)
from core.config_tenants import Price
from gateway.process.target_prices import resolve_target_price, vendor_of
from policies.price_map import load_price_map, shipped_price_map
from policies.pricing import cost_usd

OPENAI = OpenAIProviderConfig()
ANTHROPIC = AnthropicProviderConfig()


def test_every_shipped_entry_is_a_complete_price_with_a_context() -> None:
    prices = shipped_price_map()
    assert prices.as_of and set(prices.vendors) == {"openai", "anthropic", "gemini"}
    for vendor in prices.vendors.values():
        assert vendor.source.startswith("https://")
        for name, entry in vendor.models.items():
            assert entry.price().problem() is None, name
            assert entry.context > 0, name
            if entry.cached_input is not None:
                assert entry.cached_input <= entry.input, name


def test_no_name_is_listed_twice_within_a_vendor() -> None:
    for vendor in shipped_price_map().vendors.values():
        names = [n for name, e in vendor.models.items() for n in (name, *e.also)]
        assert len(names) == len(set(names))


@pytest.mark.parametrize(
    ("vendor", "model", "input_rate"),
    [
        ("openai", "gpt-4o", 2.5),
        ("openai", "gpt-4o-2024-08-06", 2.5),
        ("openai", "gpt-4o-mini", 0.15),
        ("openai", "gpt-4o-mini-2024-07-18", 0.15),
        ("anthropic", "claude-sonnet-4-5-20250929", 3.0),
        ("anthropic", "claude-sonnet-4-20250514", 3.0),
        ("anthropic", "claude-3-5-haiku-latest", 0.8),
        ("gemini", "gemini-2.5-flash", 0.3),
    ],
)
def test_lookup_strips_only_a_snapshot_suffix(vendor: str, model: str, input_rate: float) -> None:
    entry = shipped_price_map().lookup(vendor, model)  # type: ignore[arg-type]
    assert entry is not None and entry.input == input_rate


@pytest.mark.parametrize(
    ("vendor", "model"),
    [("openai", "gpt-4o-mini-x"), ("openai", "gpt-4"), ("gemini", "gpt-4o"), ("openai", "")],
)
def test_unknown_models_are_not_priced(vendor: str, model: str) -> None:
    assert shipped_price_map().lookup(vendor, model) is None  # type: ignore[arg-type]


@given(st.sampled_from(["", "-2024-08-06", "-20250929", "-latest"]))
def test_every_listed_name_and_its_snapshots_find_their_own_entry(suffix: str) -> None:
    prices = shipped_price_map()
    for vendor_name, vendor in prices.vendors.items():
        for name, entry in vendor.models.items():
            for listed in (name, *entry.also):
                assert prices.lookup(vendor_name, listed + suffix) is entry


def test_a_bad_file_names_the_bad_field(tmp_path: Path) -> None:
    bad = tmp_path / "prices.yaml"
    bad.write_text("as_of: x\nvendors: {openai: {source: s, models: {m: {input: 1}}}}\n")
    with pytest.raises(msgspec.ValidationError, match="output"):
        load_price_map(bad)


def test_vendors_by_provider_kind_and_host() -> None:
    assert vendor_of(OPENAI) == "openai"
    assert vendor_of(OpenAIProviderConfig(base_url="https://api.groq.com/openai/v1")) is None
    assert vendor_of(ANTHROPIC) == "anthropic"
    assert vendor_of(AnthropicProviderConfig(base_url="http://127.0.0.1:9/")) == "anthropic"
    assert vendor_of(GeminiProviderConfig()) == "gemini"
    assert vendor_of(VllmProviderConfig()) is None
    assert vendor_of(JaxProviderConfig(model_path="m.gguf")) is None


def test_the_config_price_wins_then_the_map_then_nothing() -> None:
    own = Price(input_per_mtok=1.0, output_per_mtok=2.0)
    price, _ = resolve_target_price("a", TargetConfig("p", "gpt-4o", price=own), OPENAI, None)
    assert price == own
    price, context = resolve_target_price("a", TargetConfig("p", "gpt-4o"), OPENAI, None)
    assert price is not None and price.input_per_mtok == 2.5 and context == 128000
    # 1,000 input and 500 output tokens at the map's gpt-4o rates.
    assert cost_usd(price, 1000, 500) == pytest.approx(0.0075)


def test_context_prefers_the_config_then_the_provider_then_the_map() -> None:
    target = TargetConfig("p", "gpt-4o", max_context=1000)
    assert resolve_target_price("a", target, OPENAI, 2000)[1] == 1000
    assert resolve_target_price("a", TargetConfig("p", "gpt-4o"), OPENAI, 2000)[1] == 2000


def test_an_unpriced_managed_target_warns_and_a_local_one_does_not() -> None:
    groq = OpenAIProviderConfig(base_url="https://api.groq.com/openai/v1")
    with structlog.testing.capture_logs() as logs:
        assert resolve_target_price("a", TargetConfig("g", "llama-3"), groq, None) == (None, None)
        resolve_target_price("b", TargetConfig("v", "mine"), VllmProviderConfig(), None)
        resolve_target_price("c", TargetConfig("p", "gpt-4o"), OPENAI, None)
    warned = [(e["alias"], e["model"]) for e in logs if e["event"] == "pricing.unknown_model"]
    assert warned == [("a", "llama-3")]
