"""Adapter for any OpenAI-compatible API: the client's body is forwarded as it came, with the
model rewritten; the upstream's answer bytes are forwarded too (decoded only to check them and
read usage)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from core.config import OpenAIProviderConfig, VllmProviderConfig
from core.errors import UpstreamMalformedError, UpstreamServerError
from core.protocols import CallContext, Capabilities
from core.wire import (
    ChatRequest,
    ChatResult,
    CompletionRequest,
    EmbeddingRequest,
    RawResult,
    RawStreamPart,
    StreamPart,
    encoder,
)
from providers.http import HttpProvider, iter_sse, mapped_errors, timeout_for
from providers.openai import responses, wire

_DONE = "[DONE]"


class OpenAIProvider(HttpProvider):
    """Chat, completions and embeddings against ``{base_url}/...`` with Bearer auth."""

    capabilities = Capabilities(embeddings=True, completions=True)

    def __init__(
        self,
        name: str,
        client: httpx.AsyncClient,
        config: OpenAIProviderConfig | VllmProviderConfig,
        api_key: str | None,
    ) -> None:
        super().__init__(name, client, config.base_url, api_key, config.headers)
        self._headers = {"content-type": "application/json", **self.extra_headers}
        # OpenAI's prompt_cache_key means nothing to a local vLLM/JAX worker (which caches
        # prefixes by itself and logs every unknown field), so it is only sent to APIs.
        self._prompt_cache_key = not isinstance(config, VllmProviderConfig)
        self._priority = isinstance(config, VllmProviderConfig) and config.priority_scheduling
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self.responses_api = speaks_responses(config)

    def _request(self, path: str, body: bytes, ctx: CallContext) -> httpx.Request:
        return self.client.build_request(
            "POST",
            f"{self.base_url}{path}",
            content=body,
            headers=self._headers,
            timeout=timeout_for(ctx),
        )

    def _body(
        self, ctx: CallContext, fallback: object, *, stream: bool, cache_key: bool = False
    ) -> bytes:
        """The upstream body; ``cache_key`` adds ``ctx.prompt_cache_key`` (chat only: it is
        a chat/responses parameter, and embeddings would reject an unknown field)."""
        raw = ctx.raw_body if ctx.raw_body is not None else encoder.encode(fallback)
        key = ctx.prompt_cache_key if cache_key and self._prompt_cache_key else None
        priority = ctx.priority if self._priority and ctx.priority else None
        return wire.rewrite_body(
            raw, ctx.upstream_model, force_usage=stream, prompt_cache_key=key, priority=priority
        )

    async def _post(self, path: str, body: bytes, ctx: CallContext) -> bytes:
        url = f"{self.base_url}{path}"
        return await self.post_bytes(url, body, self._headers, ctx, wire.read_error)

    async def chat(self, req: ChatRequest, ctx: CallContext) -> ChatResult:
        body = self._body(ctx, req, stream=False, cache_key=True)
        body = await self._post("/chat/completions", body, ctx)
        with mapped_errors(self.name):
            return ChatResult(wire.decode_response(body), raw=body)

    async def stream_chat(self, req: ChatRequest, ctx: CallContext) -> AsyncIterator[StreamPart]:
        body = self._body(ctx, req, stream=True, cache_key=True)
        async for data in self._stream("/chat/completions", body, ctx):
            with mapped_errors(self.name):
                chunk = wire.decode_chunk(data)
            yield StreamPart(chunk, raw=data)

    async def complete(self, req: CompletionRequest, ctx: CallContext) -> RawResult:
        body = await self._post("/completions", self._body(ctx, req, stream=False), ctx)
        with mapped_errors(self.name):
            return RawResult(body, wire.usage_decoder.decode(body).usage)

    async def stream_complete(
        self, req: CompletionRequest, ctx: CallContext
    ) -> AsyncIterator[RawStreamPart]:
        body = self._body(ctx, req, stream=True)
        async for data in self._stream("/completions", body, ctx):
            with mapped_errors(self.name):
                probe = wire.usage_decoder.decode(data)
            yield RawStreamPart(data, probe.usage, has_choices=bool(probe.choices))

    async def embed(self, req: EmbeddingRequest, ctx: CallContext) -> RawResult:
        body = await self._post("/embeddings", self._body(ctx, req, stream=False), ctx)
        with mapped_errors(self.name):
            return RawResult(body, wire.usage_decoder.decode(body).usage)

    async def _stream(self, path: str, body: bytes, ctx: CallContext) -> AsyncIterator[bytes]:
        """The data payloads of an SSE stream up to ``[DONE]``; the response is closed when
        the consumer stops early (client gone, fallback) as well as at the end."""
        response = await self.send(self._request(path, body, ctx), wire.read_error, stream=True)
        try:
            with mapped_errors(self.name):
                async for event in iter_sse(response):
                    if event.data == _DONE:
                        return
                    data = event.data.encode()
                    if wire.is_error_payload(data):
                        raise self._stream_error(data)
                    yield data
            raise UpstreamMalformedError(
                f"upstream {self.name} ended the stream without [DONE]", provider=self.name
            )
        finally:
            await response.aclose()

    async def responses(self, ctx: CallContext) -> ChatResult:
        """The client's Responses body (``ctx.raw_body``) passed through to
        ``{base_url}/responses``; ``raw`` is the upstream's answer as received."""
        body = self._responses_body(ctx)
        data = await self._post("/responses", body, ctx)
        with mapped_errors(self.name):
            return ChatResult(responses.decode_response(data), raw=data)

    async def stream_responses(self, ctx: CallContext) -> AsyncIterator[StreamPart]:
        """The streaming twin of ``responses``: one part per upstream event, the event's
        bytes in ``raw``, up to the terminal event (see ``responses.StreamReader``)."""
        request = self._request("/responses", self._responses_body(ctx), ctx)
        response = await self.send(request, wire.read_error, stream=True)
        reader = responses.StreamReader(self.name)
        try:
            with mapped_errors(self.name):
                async for event in iter_sse(response):
                    yield StreamPart(reader.chunk(event), raw=responses.event_bytes(event))
                    if reader.done:
                        return
                reader.check_ended()
        finally:
            await response.aclose()

    def _responses_body(self, ctx: CallContext) -> bytes:
        if ctx.raw_body is None:
            raise ValueError("a Responses passthrough needs the client's body in ctx.raw_body")
        return responses.forward_body(ctx.raw_body, ctx.upstream_model)

    def _stream_error(self, data: bytes) -> Exception:
        message, _ = wire.read_error(data)
        return UpstreamServerError(
            f"upstream {self.name} reported an error mid-stream: {message}",
            provider=self.name,
            code="upstream_stream_error",
        )


_OPENAI_API = "https://api.openai.com/v1"


def speaks_responses(config: OpenAIProviderConfig | VllmProviderConfig) -> bool:
    """Whether the upstream serves the Responses API: as configured, else (auto) only
    OpenAI's own API; a local vLLM worker never is asked."""
    if isinstance(config, VllmProviderConfig):
        return False
    if config.responses_api is not None:
        return config.responses_api
    return config.base_url.rstrip("/") == _OPENAI_API
