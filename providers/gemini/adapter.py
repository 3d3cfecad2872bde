"""The Gemini adapter: the only module here that does I/O.

Endpoints, relative to ``{base_url}/{api_version}/models/{model}``: ``:generateContent``,
``:streamGenerateContent?alt=sse``, ``:embedContent`` and ``:batchEmbedContents``. The key
travels in the ``x-goog-api-key`` header (never in the query string, so it stays out of URLs
and access logs). Errors are mapped by ``HttpProvider.send`` like every vendor's, with two
Gemini corrections: an invalid key comes back as 400 ``API_KEY_INVALID`` (the gateway's
credentials, not the client's request: ``UpstreamAuthError``), and a 429 states its wait in
``RetryInfo.retryDelay`` rather than a ``Retry-After`` header.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from urllib.parse import quote

import httpx

from core.config import GeminiProviderConfig
from core.errors import (
    InvalidRequestError,
    ProviderError,
    UpstreamAuthError,
    UpstreamMalformedError,
    UpstreamRateLimitedError,
)
from core.protocols import CallContext, Capabilities
from core.wire import (
    ChatChunk,
    ChatRequest,
    ChatResult,
    EmbeddingRequest,
    RawResult,
    StreamPart,
    make_usage,
)
from providers.gemini.convert import to_gemini_request
from providers.gemini.response import (
    ErrorFacts,
    embed_request,
    embedding_body,
    encode_status,
    read_error,
    to_chat_response,
)
from providers.gemini.stream import StreamConverter
from providers.gemini.wire import (
    Status,
    batch_embed_decoder,
    embed_decoder,
    encoder,
    event_decoder,
    response_decoder,
)
from providers.http import (
    HttpProvider,
    error_for_status,
    iter_sse,
    mapped_errors,
    timeout_for,
)


class _ErrorReader:
    """``read_message`` for ``send``/``error_for_status`` that keeps what it read, so the
    adapter can look at Gemini's error details after the generic mapping."""

    def __init__(self) -> None:
        self.facts: ErrorFacts | None = None

    def __call__(self, body: bytes) -> tuple[str, str | None]:
        self.facts = read_error(body)
        return self.facts.message, None


class GeminiProvider(HttpProvider):
    """Chat (plain and streamed) and embeddings over the Generative Language REST API."""

    capabilities = Capabilities(
        streaming=True, tools=True, vision=True, json_schema=True, embeddings=True
    )

    def __init__(
        self,
        name: str,
        client: httpx.AsyncClient,
        config: GeminiProviderConfig,
        api_key: str | None,
    ) -> None:
        super().__init__(name, client, config.base_url, api_key, config.headers)
        self.config = config
        self.api_version = config.api_version.strip("/")

    # ------------------------------------------------------------ requests
    def _url(self, model: str, method: str) -> str:
        model = quote(model.removeprefix("models/"), safe="-._~")
        return f"{self.base_url}/{self.api_version}/models/{model}:{method}"

    def _request(
        self, ctx: CallContext, method: str, body: bytes, params: dict[str, str] | None = None
    ) -> httpx.Request:
        headers = {"content-type": "application/json", **self.extra_headers}
        if self.api_key:
            headers["x-goog-api-key"] = self.api_key
        return self.client.build_request(
            "POST",
            self._url(ctx.upstream_model, method),
            content=body,
            headers=headers,
            params=params,
            timeout=timeout_for(ctx),
        )

    def _refine(self, exc: ProviderError, facts: ErrorFacts | None) -> ProviderError:
        """Apply what only Gemini's error details say to a generically mapped error."""
        if facts is None:
            return exc
        if facts.reason == "API_KEY_INVALID":
            return UpstreamAuthError(
                f"upstream {self.name} rejected the API key: {facts.message}",
                provider=self.name,
                upstream_status=exc.upstream_status,
            )
        if isinstance(exc, UpstreamRateLimitedError) and exc.retry_after is None:
            exc.retry_after = facts.retry_delay
        return exc

    async def _send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        reader = _ErrorReader()
        try:
            return await self.send(request, reader, stream=stream)
        except ProviderError as exc:
            refined = self._refine(exc, reader.facts)
            if refined is exc:
                raise
            raise refined from exc

    def _stream_error(self, status: Status) -> ProviderError:
        """The mapped error for an ``{"error": ...}`` payload inside a stream."""
        reader = _ErrorReader()
        body = encode_status(status)
        response = httpx.Response(ErrorFacts(status).code)
        exc = error_for_status(self.name, response, body, reader)
        return self._refine(exc, reader.facts)

    # ------------------------------------------------------------ chat
    async def chat(self, req: ChatRequest, ctx: CallContext) -> ChatResult:
        """One ``generateContent`` call, answered as an OpenAI chat completion."""
        body = encoder.encode(to_gemini_request(req))
        response = await self._send(self._request(ctx, "generateContent", body))
        with mapped_errors(self.name):
            decoded = response_decoder.decode(response.content)
        chat = to_chat_response(
            decoded,
            model=ctx.upstream_model,
            fallback_id=f"chatcmpl-{ctx.request_id}",
            created=int(time.time()),
            provider=self.name,
        )
        return ChatResult(response=chat)

    async def stream_chat(self, req: ChatRequest, ctx: CallContext) -> AsyncIterator[StreamPart]:
        """OpenAI chunks from ``streamGenerateContent?alt=sse``. The upstream response is
        closed when the generator ends, fails or is closed by its consumer."""
        body = encoder.encode(to_gemini_request(req))
        request = self._request(ctx, "streamGenerateContent", body, params={"alt": "sse"})
        response = await self._send(request, stream=True)
        converter = StreamConverter(
            fallback_id=f"chatcmpl-{ctx.request_id}",
            model=ctx.upstream_model,
            created=int(time.time()),
            include_usage=req.wants_usage_in_stream(),
            provider=self.name,
        )
        try:
            with mapped_errors(self.name):
                async for event in iter_sse(response):
                    for chunk in self._event_chunks(converter, event.data):
                        yield StreamPart(chunk=chunk)
            for chunk in converter.close():
                yield StreamPart(chunk=chunk)
        finally:
            await response.aclose()

    def _event_chunks(self, converter: StreamConverter, data: str) -> list[ChatChunk]:
        if not data.strip():
            return []
        event = event_decoder.decode(data)
        if event.error is not None:
            raise self._stream_error(event.error)
        return converter.feed(event)

    # ------------------------------------------------------------ embeddings
    async def embed(self, req: EmbeddingRequest, ctx: CallContext) -> RawResult:
        """An OpenAI ``/v1/embeddings`` body: one input via ``embedContent``, several via
        ``batchEmbedContents``. Gemini reports no token counts here: usage is 0 (unknown)."""
        texts = req.input_texts()
        if texts is None:
            raise InvalidRequestError("Gemini embeds text only, not token ids", param="input")
        if not texts:
            raise InvalidRequestError("input must not be empty", param="input")
        single = len(texts) == 1
        payload = embed_request(texts, ctx.upstream_model.removeprefix("models/"), req.dimensions)
        method = "embedContent" if single else "batchEmbedContents"
        response = await self._send(self._request(ctx, method, encoder.encode(payload)))
        with mapped_errors(self.name):
            if single:
                vectors = [embed_decoder.decode(response.content).embedding.values]
            else:
                decoded = batch_embed_decoder.decode(response.content)
                vectors = [embedding.values for embedding in decoded.embeddings]
        if len(vectors) != len(texts):
            raise UpstreamMalformedError(
                f"upstream {self.name} returned {len(vectors)} embeddings for {len(texts)} inputs",
                provider=self.name,
            )
        body = embedding_body(vectors, ctx.upstream_model, req.encoding_format)
        return RawResult(body=body, usage=make_usage(0, 0))
