"""The worker's engine slot: loading in the background, readiness, and submitting requests.

The HTTP server listens from the first second (so ``/health`` can say 503 while the model
loads and compiles); ``ready`` turns true after the one-token probe. A failed load calls
``on_fatal`` so the process exits instead of answering 503 forever.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from core.config import JaxProviderConfig
from core.errors import GatewayError, ModelNotFoundError
from local_tier import iterators, serving
from local_tier.jax.api import (
    EngineProtocol,
    EngineStats,
    GenerationOutput,
    GenerationRequest,
)
from local_tier.worker.metrics import WorkerMetrics

log = logging.getLogger("switchyard.worker")

EngineLoader = Callable[[JaxProviderConfig], Awaitable[EngineProtocol]]


class NotReadyError(GatewayError):
    """The model is still loading (vLLM is not listening at all then; we say so with 503)."""

    status = 503
    type = "server_error"
    code = "model_loading"


class WorkerState:
    """Holds the engine once it is ready, and the metrics that describe it."""

    def __init__(
        self,
        config: JaxProviderConfig,
        loader: EngineLoader,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.config = config
        self.model_name = config.served_model_name
        self.engine: EngineProtocol | None = None
        self.metrics = WorkerMetrics(
            self.model_name, self._stats, max_model_len=config.max_model_len
        )
        self._loader = loader
        self._on_fatal = on_fatal
        self._task: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        return self.engine is not None

    def _stats(self) -> EngineStats | None:
        return self.engine.stats() if self.engine is not None else None

    # ------------------------------------------------------------ lifecycle
    def begin_loading(self) -> None:
        """Start loading in the background (called from the app's startup hook)."""
        self._task = asyncio.create_task(self._load(), name="engine-load")

    async def _load(self) -> None:
        started = time.monotonic()
        try:
            self.engine = await self._loader(self.config)
        except Exception as exc:
            log.exception("loading the model failed")
            if self._on_fatal is not None:
                self._on_fatal(exc)
            return
        log.info("model %s ready in %.1f s", self.model_name, time.monotonic() - started)

    async def shutdown(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        engine, self.engine = self.engine, None
        if engine is not None:
            await engine.stop()

    # ------------------------------------------------------------ requests
    def engine_for(self, model: str | None) -> EngineProtocol:
        """The engine when ready and ``model`` (if given) is the served name."""
        if model is not None and model != self.model_name:
            raise ModelNotFoundError(f"The model `{model}` does not exist.", param="model")
        if self.engine is None:
            raise NotReadyError("The model is still loading; retry shortly.")
        return self.engine

    async def submit(
        self, engine: EngineProtocol, request: GenerationRequest, started: float
    ) -> AsyncIterator[GenerationOutput]:
        """Run ``request``; returns its outputs once the first one exists, so rejections
        raise (as ``core.errors``) before any response starts. The outputs are timed for
        the latency histograms and closing them aborts the sequence."""
        outputs = serving.generate(engine, request)
        return await iterators.started(self.metrics.timed(outputs, started))
