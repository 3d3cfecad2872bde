"""``POST /v1/embeddings``: targets whose adapter embeds; the upstream's JSON answered as is."""

from __future__ import annotations

from typing import Any, cast

import msgspec
from litestar import Request, Response, post

from core.protocols import EmbeddingProvider
from core.wire import EmbeddingRequest, RawResult
from gateway.http.errors import decode_body
from gateway.request.scope import Scope, body_tokens

_decoder = msgspec.json.Decoder(EmbeddingRequest)


@post("/v1/embeddings", status_code=200)
async def embeddings(request: Request[Any, Any, Any]) -> Response[bytes]:
    scope = Scope(request, "embeddings")
    try:
        scope.authenticate()
        raw = await scope.read_body(request)
        req: EmbeddingRequest = decode_body(_decoder, raw)
        scope.authorize(req.model)
        prompt = body_tokens(raw)
        plan = scope.plan_other(req.model, EmbeddingProvider, "embeddings", prompt, 0)
        await scope.admit(plan, prompt, 0)
        plan = await scope.wait_for_capacity(plan)
        ctx = scope.record.call_context
        result: RawResult = await scope.call(
            req.model, plan, lambda t: cast(EmbeddingProvider, t.provider).embed(req, ctx(t, raw))
        )
    except BaseException as exc:
        await scope.close(*scope.fail(exc))
        raise
    return await scope.answer_raw(result)
