"""The Litestar application: routes, error handlers and lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from litestar import Litestar

from core.config import Config
from gateway.http.abandon import finish_abandoned
from gateway.http.errors import exception_handlers
from gateway.process.reload import Reloader
from gateway.process.runtime import Progress
from gateway.process.state import GatewayState
from gateway.routes import (
    admin,
    chat,
    completions,
    embeddings,
    messages,
    metrics,
    models,
    openapi,
    responses,
)
from gateway.routes import usage as usage_routes
from gateway.telemetry.hub import Telemetry


def create_app(
    config: Config, env: Mapping[str, str] | None = None, progress: Progress | None = None
) -> Litestar:
    """An app serving ``config``. ``env`` (default: the process environment) supplies the
    API keys that the config names; ``progress`` receives local-model loading messages."""

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        state = GatewayState(config, env, progress)
        app.state.gateway = state
        telemetry = app.state.telemetry = Telemetry(config)
        await state.start()
        reloader: Reloader | None = None
        if config.source is not None:
            reloader = Reloader(state, config.source)
            app.state.reloader = reloader  # state knows nothing of reloads (no import circle)
            if config.server.watch_config:
                state.spawn(reloader.watch(config.server.watch_interval_s))
        telemetry.metrics.watch(state, reloader)
        try:
            yield
        finally:
            await state.aclose()
            telemetry.shutdown()

    app = Litestar(
        route_handlers=[
            chat.chat_completions,
            messages.messages,
            messages.count_tokens,
            responses.responses,
            completions.completions,
            embeddings.embeddings,
            models.list_models,
            models.get_model,
            models.healthz,
            models.readyz,
            metrics.prometheus_metrics,
            admin.reload_policy,
            admin.list_targets,
            admin.goodput,
            admin.tenant_quota,
            usage_routes.admin_usage,
            usage_routes.tenant_usage,
            openapi.openapi_document,
        ],
        lifespan=[lifespan],
        middleware=[finish_abandoned],
        exception_handlers=exception_handlers(by_prefix={messages.PATH: messages.anthropic_shape}),
        request_max_body_size=config.server.max_body_bytes,
        openapi_config=None,
        logging_config=None,
    )
    openapi.publish(app)  # after the routes exist: the document lists them
    return app
