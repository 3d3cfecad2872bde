"""The policy file's schema: the issue's example loads, every error names its key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import (
    AnthropicProviderConfig,
    ConfigError,
    GeminiProviderConfig,
    JaxProviderConfig,
    OpenAIProviderConfig,
    load_config,
    parse_config,
)

ISSUE_EXAMPLE = """
providers:
  oa: {type: openai, base_url: "https://api.openai.com/v1", api_key_env: OPENAI_API_KEY}
  an: {type: anthropic, api_key_env: ANTHROPIC_API_KEY}
  ge: {type: gemini, api_key_env: GEMINI_API_KEY}
models:
  gpt-4o-mini: {targets: [{provider: oa, model: gpt-4o-mini}]}
  smart: {targets: [{provider: an, model: claude-sonnet-4-5}, {provider: oa, model: gpt-4o}]}
"""


def test_issue_example_loads_with_vendor_defaults():
    config = parse_config(ISSUE_EXAMPLE)
    assert isinstance(config.providers["oa"], OpenAIProviderConfig)
    anthropic = config.providers["an"]
    assert isinstance(anthropic, AnthropicProviderConfig)
    assert anthropic.base_url == "https://api.anthropic.com"
    gemini = config.providers["ge"]
    assert isinstance(gemini, GeminiProviderConfig)
    assert gemini.base_url == "https://generativelanguage.googleapis.com"
    assert [t.provider for t in config.models["smart"].targets] == ["an", "oa"]


def test_shipped_config_is_valid_and_needs_no_keys():
    config = load_config(Path(__file__).resolve().parents[2] / "config.yaml")
    local = [p for p in config.providers.values() if isinstance(p, JaxProviderConfig)]
    assert local and all(p.api_key_env is None for p in local)


def test_every_error_is_reported_with_its_key_path():
    text = """
providers:
  oa: {type: openai, timeout_s: 0}
  x: {type: nope}
  an: {type: anthropic, bogus: 1}
models:
  m: {targets: [{provider: zz, model: a}]}
  n: {targets: []}
server: {max_body_bytes: -1}
extra: 1
"""
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    errors = info.value.errors
    assert "extra: unknown section" in errors
    prefixes = [e.split(":")[0] for e in errors]
    assert set(prefixes) >= {
        "providers.oa.timeout_s",
        "providers.x.type",
        "providers.an",
        "models.n.targets",
        "server.max_body_bytes",
        "models.m.targets[0].provider",
    }
    assert any("unknown provider 'zz'" in e for e in errors)
    assert any("bogus" in e for e in errors)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("providers: [1, 2]", "providers: expected a mapping"),
        ("- just\n- a list", "(top level): expected a mapping"),
        ("providers: {a: {type: openai, api_key_env: 'bad name'}}", "providers.a.api_key_env"),
        ("key: [unclosed", "not valid YAML"),
    ],
)
def test_shape_errors(text, fragment):
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert any(fragment in e for e in info.value.errors)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "absent.yaml")
    assert "cannot read" in info.value.errors[0]


def test_empty_file_is_an_empty_config():
    config = parse_config("")
    assert config.providers == {} and config.models == {}


@pytest.mark.parametrize("name", ["priority", "slo", "prefix_aware", "round_robin"])
def test_a_bare_strategy_name_means_its_defaults(name):
    text = f"""
providers: {{p: {{type: openai}}}}
models:
  a: {{targets: [{{provider: p, model: m}}], strategy: {name}}}
  b: {{targets: [{{provider: p, model: m}}], strategy: {{type: {name}}}}}
"""
    config = parse_config(text)
    assert config.models["a"].strategy == config.models["b"].strategy


@pytest.mark.parametrize("strategy", ["nope", "{type: nope}", "3", "{type: slo, nope: 1}"])
def test_strategy_errors_show_the_accepted_forms(strategy):
    text = f"providers: {{p: {{type: openai}}}}\nmodels:\n  a: {{targets: [{{provider: p, model: m}}], strategy: {strategy}}}\n"
    with pytest.raises(ConfigError) as raised:
        parse_config(text)
    (error,) = raised.value.errors
    assert error.startswith("models.a.strategy")
    assert "`strategy: slo`" in error and "round_robin" in error


def test_webhooks_must_name_a_tenant_or_the_fallback():
    hook = '{url: "https://hooks.example/batch", secret_env: HOOK_SECRET}'
    with pytest.raises(ConfigError) as info:
        parse_config(f"batch: {{webhooks: {{nobody: {hook}}}}}")
    assert info.value.errors == ["batch.webhooks.nobody: unknown tenant (a tenant's name, or '*')"]
    fallback = parse_config(f"batch: {{webhooks: {{'*': {hook}}}}}")
    assert set(fallback.batch.webhooks) == {"*"}
