"""Anthropic Messages API provider (``type: anthropic`` in the config)."""

from providers.anthropic.adapter import AnthropicProvider

__all__ = ["AnthropicProvider"]
