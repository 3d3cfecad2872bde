"""The JAX inference engine of the local tier (see ``local_tier.jax.api`` for the contract).

``Engine``, ``Tokenizer`` and ``render_chat_prompt`` are imported lazily so that importing the
API types does not import JAX (whose XLA flags must be set before its first import).
"""

from __future__ import annotations

from typing import Any

from local_tier.jax.api import (
    EngineConfig,
    EngineOverloadedError,
    EngineProtocol,
    EngineRequestError,
    EngineStats,
    GenerationOutput,
    GenerationRequest,
    SamplingParams,
    TokenizerProtocol,
)

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineOverloadedError",
    "EngineProtocol",
    "EngineRequestError",
    "EngineStats",
    "GenerationOutput",
    "GenerationRequest",
    "SamplingParams",
    "Tokenizer",
    "TokenizerProtocol",
    "render_chat_prompt",
]

_LAZY = {
    "Engine": "local_tier.jax.engine",
    "Tokenizer": "local_tier.jax.tokenizer",
    "render_chat_prompt": "local_tier.jax.tokenizer",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'local_tier.jax' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
