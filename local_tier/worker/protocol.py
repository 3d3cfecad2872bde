"""vLLM's small extra endpoints' wire shapes: ``/tokenize``, ``/detokenize``, ``/v1/models``."""

from __future__ import annotations

import time
from typing import Any

from msgspec import Struct

from core.errors import InvalidRequestError
from core.wire import Message
from local_tier import serving
from local_tier.jax.api import EngineProtocol


class TokenizeRequest(Struct):
    """Either ``prompt`` (plain text) or ``messages`` (rendered with the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_generation_prompt: bool = True


class DetokenizeRequest(Struct):
    tokens: list[int]
    model: str | None = None


def tokenize_response(engine: EngineProtocol, req: TokenizeRequest) -> dict[str, Any]:
    """vLLM's answer: the ids, their count and the context limit."""
    if (req.prompt is None) == (req.messages is None):
        raise InvalidRequestError("Give exactly one of 'prompt' or 'messages'.", param="prompt")
    if req.messages is not None:
        messages = serving.template_messages(req.messages)
        text = serving.render_prompt(engine, messages, req.add_generation_prompt)
    else:
        text = req.prompt or ""
    tokens = engine.tokenizer.encode(text)
    return {
        "count": len(tokens),
        "max_model_len": engine.max_model_len,
        "tokens": tokens,
        "token_strs": None,
    }


def model_list(name: str, root: str | None, max_model_len: int) -> dict[str, Any]:
    """``/v1/models`` the way vLLM lists its one served model."""
    card = {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "switchyard",
        "root": root or name,
        "parent": None,
        "max_model_len": max_model_len,
    }
    return {"object": "list", "data": [card]}
