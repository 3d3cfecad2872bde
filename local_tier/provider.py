"""``JaxProvider``: the JAX engine in the gateway's own process, as an ordinary provider.

``start()`` loads the weights in a worker thread (the event loop keeps answering /healthz
meanwhile), compiles (``Engine.start``), then runs a one-token probe; ``is_ready()`` turns true
only after the probe answered. Calls raise only ``core.errors`` types: a request the engine
rejects is an ``InvalidRequestError``/``ContextLengthError`` with ``param``; a full queue is an
``UpstreamRateLimitedError`` (retry after 1 s) so the router spills over to the next target.
vLLM's sampling extensions (``ignore_eos``, ``min_tokens``, ``stop_token_ids``, ...) are read
from the client's JSON body (``CallContext.raw_body``), as the worker reads them.
Closing a stream's generator aborts the sequence and frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager

from core.config import JaxProviderConfig
from core.errors import ProviderError, UpstreamServerError, UpstreamTimeoutError
from core.protocols import CallContext, Capabilities
from core.wire import (
    ChatRequest,
    ChatResult,
    CompletionRequest,
    RawResult,
    RawStreamPart,
    StreamPart,
)
from local_tier import iterators, serving
from local_tier.jax.api import (
    EngineConfig,
    EngineProtocol,
    GenerationOutput,
    GenerationRequest,
    SamplingParams,
)
from local_tier.vllm_extensions import VllmExtensions, vllm_extensions

ProgressFn = Callable[[str], None]
EngineLoader = Callable[[JaxProviderConfig, ProgressFn | None], Awaitable[EngineProtocol]]


def engine_config(cfg: JaxProviderConfig) -> EngineConfig:
    """The engine settings named by a provider config (served name included)."""
    return EngineConfig(
        model_path=cfg.model_path,
        dtype=cfg.dtype,
        backend=cfg.backend,
        tensor_parallel=cfg.tensor_parallel,
        data_parallel=cfg.data_parallel,
        max_batch_size=cfg.max_batch_size,
        max_model_len=cfg.max_model_len,
        kv_cache_tokens=cfg.kv_cache_tokens,
        kv_cache_fraction=cfg.kv_cache_fraction,
        attention=cfg.attention,
        block_size=cfg.block_size,
        compile_cache_dir=cfg.compile_cache_dir,
        model_name=cfg.served_model_name,
    )


async def open_engine(cfg: JaxProviderConfig, progress: ProgressFn | None) -> EngineProtocol:
    """Load (in a thread), compile and probe an engine; returns it ready for traffic."""
    # imports JAX: only when a model is really wanted
    from local_tier.jax.replicas import build_engine

    build = functools.partial(build_engine, engine_config(cfg), progress)
    engine: EngineProtocol = await asyncio.to_thread(build)
    await engine.start()
    await probe(engine)
    if progress is not None:
        progress(f"{engine.model_name}: ready")
    return engine


async def probe(engine: EngineProtocol) -> None:
    """Generate one greedy token end to end; raises if the engine cannot answer."""
    ids = engine.tokenizer.encode("Hello")
    request = GenerationRequest(
        f"probe-{uuid.uuid4().hex[:8]}", ids, SamplingParams(max_tokens=1, temperature=0.0)
    )
    with serving.engine_errors():
        answer = await serving.collect(engine.generate(request))
    if answer.last.completion_tokens != 1:
        raise RuntimeError(f"engine probe produced {answer.last.completion_tokens} tokens")


@contextmanager
def _named(provider: str) -> Iterator[None]:
    """Name this provider on any ``ProviderError`` that leaves the block without a name."""
    try:
        yield
    except ProviderError as exc:
        exc.provider = exc.provider or provider
        raise


class JaxProvider:
    """The local JAX engine as a ``Provider`` and ``CompletionProvider``."""

    def __init__(
        self,
        name: str,
        config: JaxProviderConfig,
        progress: ProgressFn | None = None,
        *,
        loader: EngineLoader = open_engine,
    ) -> None:
        """``loader`` builds a ready engine (tests pass a fake; default: the real one)."""
        self.name = name
        self.config = config
        self._progress = progress
        self._loader = loader
        self._engine: EngineProtocol | None = None
        self.capabilities = _capabilities(config.max_model_len)

    @property
    def engine(self) -> EngineProtocol | None:
        """The running engine once ``start()`` finished (probe included), else None."""
        return self._engine

    async def start(self) -> None:
        """Load, compile and probe; ``is_ready()`` turns true only when all three worked."""
        engine = await self._loader(self.config, self._progress)
        self.capabilities = _capabilities(engine.max_model_len)
        self._engine = engine

    def is_ready(self) -> bool:
        return self._engine is not None

    async def aclose(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.stop()

    def _ready_engine(self) -> EngineProtocol:
        if self._engine is None:
            raise UpstreamServerError("The local model is still loading.", provider=self.name)
        return self._engine

    def _request_id(self, ctx: CallContext) -> str:
        # A retry of the same gateway request may overlap its aborted first attempt.
        return f"{ctx.request_id}-{uuid.uuid4().hex[:8]}"

    async def _started(
        self, request: GenerationRequest, ctx: CallContext
    ) -> AsyncIterator[GenerationOutput]:
        """Submit ``request`` and wait for its first output under the first-token deadline,
        so rejections and timeouts raise here, before anything reached the caller."""
        request.priority = ctx.priority
        outputs = serving.generate(self._ready_engine(), request, self.name)
        try:
            async with asyncio.timeout(ctx.timeouts.first_token):
                return await iterators.started(outputs)
        except TimeoutError as exc:
            raise UpstreamTimeoutError(
                "The local model did not start answering in time.", provider=self.name
            ) from exc

    async def _collect(self, request: GenerationRequest, ctx: CallContext) -> serving.Collected:
        try:
            async with asyncio.timeout(ctx.timeouts.total):
                return await serving.collect(await self._started(request, ctx))
        except TimeoutError as exc:
            raise UpstreamTimeoutError(
                "The local model did not finish in time.", provider=self.name
            ) from exc

    async def chat(self, req: ChatRequest, ctx: CallContext) -> ChatResult:
        with _named(self.name):
            engine = self._ready_engine()
            request = serving.chat_generation(engine, req, self._request_id(ctx), _ext(ctx))
            answer = await self._collect(request, ctx)
            meta = serving.new_meta("chatcmpl", engine.model_name)
            return ChatResult(serving.chat_response(meta, answer))

    async def stream_chat(self, req: ChatRequest, ctx: CallContext) -> AsyncIterator[StreamPart]:
        """Chunks of one answer; closing this generator aborts the engine sequence."""
        with _named(self.name):
            engine = self._ready_engine()
            request = serving.chat_generation(engine, req, self._request_id(ctx), _ext(ctx))
            outputs = await self._started(request, ctx)
            meta = serving.new_meta("chatcmpl", engine.model_name)
            chunks = serving.chat_chunks(outputs, meta, req.wants_usage_in_stream())
            async with iterators.owned(chunks):
                async for chunk in chunks:
                    yield StreamPart(chunk)

    async def complete(self, req: CompletionRequest, ctx: CallContext) -> RawResult:
        with _named(self.name):
            engine = self._ready_engine()
            request = serving.completion_generation(engine, req, self._request_id(ctx), _ext(ctx))
            answer = await self._collect(request, ctx)
            meta = serving.new_meta("cmpl", engine.model_name)
            body, usage = serving.completion_body(meta, answer)
            return RawResult(body, usage)

    async def stream_complete(
        self, req: CompletionRequest, ctx: CallContext
    ) -> AsyncIterator[RawStreamPart]:
        """Text-completion chunks (JSON bytes); closing this generator aborts the sequence."""
        with _named(self.name):
            engine = self._ready_engine()
            request = serving.completion_generation(engine, req, self._request_id(ctx), _ext(ctx))
            outputs = await self._started(request, ctx)
            meta = serving.new_meta("cmpl", engine.model_name)
            usage = bool(req.stream_options and req.stream_options.include_usage)
            parts = serving.completion_stream(outputs, meta, usage)
            async with iterators.owned(parts):
                async for part in parts:
                    yield part


def _ext(ctx: CallContext) -> VllmExtensions:
    """vLLM's sampling extensions from the client's own JSON (``ctx.raw_body``), so a
    gateway client can send them as it would to vLLM. Their ``priority`` is not the
    client's to choose here: ``_started`` sets the gateway's (``ctx.priority``)."""
    return vllm_extensions(ctx.raw_body)


def _capabilities(max_context: int) -> Capabilities:
    return Capabilities(
        streaming=True,
        tools=False,
        vision=False,
        json_schema=False,
        completions=True,
        max_context=max_context,
    )
