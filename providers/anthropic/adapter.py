"""The Anthropic Messages API adapter: the only module here that does I/O."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
from httpx_sse import ServerSentEvent, SSEError

from core.config import AnthropicProviderConfig
from core.errors import UpstreamMalformedError
from core.protocols import CallContext, Capabilities
from core.wire import ChatRequest, ChatResult, StreamPart
from providers.anthropic import convert, wire
from providers.anthropic.cache_control import encode_request
from providers.anthropic.stream import StreamConverter
from providers.http import HttpProvider, iter_sse, mapped_errors, timeout_for


def read_error_message(body: bytes) -> tuple[str, str | None]:
    """Anthropic's error body ``{"type":"error","error":{"type","message"}}`` -> (message,
    None); Anthropic names no parameter. Undecodable bodies raise (the caller falls back)."""
    return wire.error_decoder.decode(body).error.message, None


class AnthropicProvider(HttpProvider):
    """Chat over ``POST {base_url}/v1/messages``, streamed or not.

    Sends ``x-api-key`` (when a key is configured), ``anthropic-version`` and the configured
    extra headers (which may override the others, e.g. to add ``anthropic-beta``).
    Prompt-cache breakpoints: the client's own ``cache_control`` marks (read from
    ``ctx.raw_body``), else automatic ones when ``ctx.cache_control_min_chars`` is set
    (see ``providers.anthropic.cache_control``).
    """

    capabilities = Capabilities(streaming=True, tools=True, vision=True, json_schema=True)

    def __init__(
        self,
        name: str,
        client: httpx.AsyncClient,
        config: AnthropicProviderConfig,
        api_key: str | None,
    ) -> None:
        super().__init__(name, client, config.base_url, api_key, config.headers)
        self.config = config
        self.url = f"{self.base_url}/v1/messages"

    def _headers(self) -> dict[str, str]:
        headers = {
            "anthropic-version": self.config.anthropic_version,
            "content-type": "application/json",
        }
        if self.api_key:
            headers["x-api-key"] = self.api_key
        headers.update(self.extra_headers)
        return headers

    def _request(self, req: ChatRequest, ctx: CallContext, *, stream: bool) -> httpx.Request:
        body = encode_request(
            req,
            ctx.upstream_model,
            self.config.default_max_tokens,
            stream=stream,
            raw_body=ctx.raw_body,
            min_chars=ctx.cache_control_min_chars,
        )
        headers = self._headers()
        if stream:
            headers["accept"] = "text/event-stream"
        return self.client.build_request(
            "POST",
            self.url,
            content=body,
            headers=headers,
            timeout=timeout_for(ctx),
        )

    async def chat(self, req: ChatRequest, ctx: CallContext) -> ChatResult:
        """One non-streaming call; the answer converted to OpenAI's shape."""
        request = self._request(req, ctx, stream=False)
        response = await self.send(request, read_error_message)
        with mapped_errors(self.name):
            message = wire.response_decoder.decode(response.content)
        converted = convert.to_chat_response(
            message,
            created=int(time.time()),
            json_tool=convert.json_tool_name(req),
            provider=self.name,
        )
        return ChatResult(converted)

    async def stream_chat(self, req: ChatRequest, ctx: CallContext) -> AsyncIterator[StreamPart]:
        """OpenAI chunks as Anthropic's events arrive. Errors (also mid-stream ones) are raised
        from the generator; closing it closes the upstream connection."""
        request = self._request(req, ctx, stream=True)
        converter = StreamConverter(
            provider=self.name,
            created=int(time.time()),
            include_usage=req.wants_usage_in_stream(),
            json_tool=convert.json_tool_name(req),
        )
        response = await self.send(request, read_error_message, stream=True)
        try:
            with mapped_errors(self.name):
                async for event in self._events(response):
                    for chunk in converter.feed(event.event, event.data):
                        yield StreamPart(chunk)
                converter.finish()
        finally:
            await response.aclose()

    async def _events(self, response: httpx.Response) -> AsyncIterator[ServerSentEvent]:
        try:
            async for event in iter_sse(response):
                yield event
        except SSEError as exc:  # e.g. a 200 answer that is not an event stream
            raise UpstreamMalformedError(
                f"upstream {self.name} sent a malformed stream: {exc}", provider=self.name
            ) from exc
