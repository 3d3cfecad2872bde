"""The interfaces where providers, routers, policies and the gateway meet.

Providers never import routers or policies (and the other way round); both sides depend
only on these shapes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from msgspec import Struct

from core.wire import (
    ChatRequest,
    ChatResult,
    CompletionRequest,
    EmbeddingRequest,
    RawResult,
    RawStreamPart,
    StreamPart,
)


class Capabilities(Struct, frozen=True, kw_only=True):
    """What a provider can do; filters compare requests against it."""

    streaming: bool = True
    tools: bool = True
    vision: bool = True
    json_schema: bool = True
    embeddings: bool = False
    completions: bool = False
    max_context: int | None = None


class Timeouts(Struct, frozen=True, kw_only=True):
    """Seconds. ``first_token`` bounds the wait for the first streamed chunk (or the whole
    answer of a non-streaming call when it is shorter than ``total``)."""

    connect: float = 5.0
    total: float = 600.0
    first_token: float = 60.0
    idle: float = 60.0  # longest gap between two streamed chunks


class CallContext(Struct, kw_only=True):
    """Everything one call to one target needs besides the request itself."""

    request_id: str
    upstream_model: str
    timeouts: Timeouts = Timeouts()
    raw_body: bytes | None = None  # the client's JSON, forwarded to OpenAI-compatible upstreams
    tenant: str | None = None
    prompt_cache_key: str | None = None  # OpenAI's prompt_cache_key, set per tenant
    cache_control_min_chars: int | None = None  # Anthropic: mark stable prefixes this long
    # Engine scheduling priority, lower first (vLLM's convention): 0 interactive, 1 a batch
    # item. The in-process JAX engine pauses worse work while better work runs.
    priority: int = 0


@runtime_checkable
class Provider(Protocol):
    """A chat backend. Raises only ``core.errors.ProviderError`` subclasses (and
    ``InvalidRequestError`` for requests it cannot express)."""

    name: str
    capabilities: Capabilities

    async def chat(self, req: ChatRequest, ctx: CallContext) -> ChatResult: ...

    def stream_chat(self, req: ChatRequest, ctx: CallContext) -> AsyncIterator[StreamPart]: ...

    async def start(self) -> None:
        """Prepare for traffic (load a model, warm a pool). Called once at startup."""
        ...

    def is_ready(self) -> bool: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class EmbeddingProvider(Protocol):
    async def embed(self, req: EmbeddingRequest, ctx: CallContext) -> RawResult:
        """Return an OpenAI ``/v1/embeddings`` body."""
        ...


@runtime_checkable
class CompletionProvider(Protocol):
    async def complete(self, req: CompletionRequest, ctx: CallContext) -> RawResult: ...

    def stream_complete(
        self, req: CompletionRequest, ctx: CallContext
    ) -> AsyncIterator[RawStreamPart]: ...
