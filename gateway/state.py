"""The app's long-lived state: the shared HTTP client and the current runtime snapshot."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping

import structlog

from core.config import Config
from gateway.runtime import Progress, Runtime
from providers.transport import make_client

_log = structlog.get_logger("switchyard")


class GatewayState:
    """Owns the HTTP client and the runtime; ``runtime`` is read once per request."""

    def __init__(
        self, config: Config, env: Mapping[str, str] | None = None, progress: Progress | None = None
    ) -> None:
        self.client = make_client()
        self.env = os.environ if env is None else env
        self.progress = progress
        self.runtime = Runtime(config, self.client, self.env, progress)
        self.created = int(time.time())
        self._start_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start providers in the background so /healthz answers while a model loads."""
        self._start_task = asyncio.create_task(self._start())

    async def _start(self) -> None:
        try:
            await self.runtime.start()
        except Exception:
            _log.exception("providers.start_failed")
            raise
        _log.info("gateway.ready", models=sorted(self.runtime.targets))

    def startup_failed(self) -> BaseException | None:
        task = self._start_task
        if task is None or not task.done() or task.cancelled():
            return None
        return task.exception()

    async def aclose(self) -> None:
        if self._start_task is not None and not self._start_task.done():
            self._start_task.cancel()
        await self.runtime.aclose()
        await self.client.aclose()
