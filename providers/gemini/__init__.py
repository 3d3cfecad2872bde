"""Google Gemini (Generative Language API): chat, streaming and embeddings."""

from providers.gemini.adapter import GeminiProvider

__all__ = ["GeminiProvider"]
