"""What the gateway knows about a batch line's body: the model alias exists and the caller
may use it, and the body is what the endpoint accepts (the endpoint's own decoder, so a
line that would be a 400 when sent alone is an error of the file instead).

Used twice with the same rules: when a file is uploaded (400 listing the bad lines) and
when the runner validates a batch (the batch fails with the lines in ``errors``), the
second time against the config current then."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from core.errors import GatewayError
from core.tenancy import Principal
from core.wire import ChatRequest, CompletionRequest, EmbeddingRequest
from gateway.dialects.responses import decode_request
from gateway.http.errors import decode_body
from gateway.process.runtime import Runtime
from policies.jobs.jsonl import BodyCheck, Problem

_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    "/v1/chat/completions": msgspec.json.Decoder(ChatRequest),
    "/v1/completions": msgspec.json.Decoder(CompletionRequest),
    "/v1/embeddings": msgspec.json.Decoder(EmbeddingRequest),
}


def _decoder_for(url: str) -> Callable[[bytes], object]:
    if url == "/v1/responses":
        return decode_request
    decoder = _DECODERS[url]
    return lambda body: decode_body(decoder, body)


def body_check(runtime: Runtime, principal: Principal) -> BodyCheck:
    """The ``check`` for ``policies.jobs.jsonl.parse_jsonl``: ``runtime``'s aliases, the
    caller's model rules, the endpoint's schema."""
    models, auth = runtime.config.models, runtime.auth

    def check(url: str, model: str, body: bytes) -> Problem | None:
        if model not in models:
            return Problem("model_not_found", f"The model '{model}' does not exist.", "model")
        if not auth.may_use(principal, model):
            message = f"Tenant '{principal.tenant}' is not allowed to use model '{model}'."
            return Problem("model_not_allowed", message, "model")
        try:
            _decoder_for(url)(body)
        except GatewayError as exc:
            return Problem("invalid_request", exc.message, exc.param)
        return None

    return check
