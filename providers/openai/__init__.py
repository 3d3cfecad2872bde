"""OpenAI and every OpenAI-compatible API (configured by ``base_url``)."""

from providers.openai.adapter import OpenAIProvider

__all__ = ["OpenAIProvider"]
