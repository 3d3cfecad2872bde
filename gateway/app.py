"""The Litestar application: routes, error handlers and lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.exceptions import HTTPException

from core.config import Config
from core.errors import GatewayError
from gateway import chat, misc
from gateway.errors import gateway_error_handler, http_error_handler, unexpected_error_handler
from gateway.runtime import Progress
from gateway.state import GatewayState


def create_app(
    config: Config, env: Mapping[str, str] | None = None, progress: Progress | None = None
) -> Litestar:
    """An app serving ``config``. ``env`` (default: the process environment) supplies the
    API keys that the config names; ``progress`` receives local-model loading messages."""

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        state = GatewayState(config, env, progress)
        app.state.gateway = state
        state.start()
        try:
            yield
        finally:
            await state.aclose()

    return Litestar(
        route_handlers=[
            chat.chat_completions,
            misc.completions,
            misc.embeddings,
            misc.list_models,
            misc.get_model,
            misc.healthz,
            misc.readyz,
        ],
        lifespan=[lifespan],
        exception_handlers={
            GatewayError: gateway_error_handler,
            HTTPException: http_error_handler,
            Exception: unexpected_error_handler,
        },
        request_max_body_size=config.server.max_body_bytes,
        openapi_config=None,
        logging_config=None,
    )
