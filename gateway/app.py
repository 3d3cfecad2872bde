"""The Litestar application: routes, error handlers and lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from litestar import Litestar

from core.config import Config
from gateway.console import console_router
from gateway.http.abandon import finish_abandoned
from gateway.http.errors import exception_handlers
from gateway.http.idempotency import STATE_KEY as IDEMPOTENCY_KEY
from gateway.http.idempotency import idempotency_keys
from gateway.http.jwt_keys import fetch_unknown_jwt_keys
from gateway.jobs.runner import close_jobs, open_jobs
from gateway.process.reload import Reloader
from gateway.process.runtime import Progress
from gateway.process.state import GatewayState
from gateway.routes import (
    admin,
    admin_keys,
    admin_tenants,
    batches,
    chat,
    completions,
    embeddings,
    files,
    messages,
    metrics,
    models,
    openapi,
    responses,
    webhooks,
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
        jobs = app.state.jobs = await open_jobs(app, state)  # the batch runner and its store
        reloader: Reloader | None = None
        if config.source is not None:
            reloader = Reloader(state, config.source)
            app.state.reloader = reloader  # state knows nothing of reloads (no import circle)
            if config.server.watch_config:
                state.spawn(reloader.watch(config.server.watch_interval_s))
        telemetry.metrics.watch(state, reloader, lambda: app.state.get(IDEMPOTENCY_KEY))
        try:
            yield
        finally:
            await close_jobs(jobs, state)  # its items are requests: before the state drains
            await state.aclose()
            telemetry.shutdown()

    shapes = {messages.PATH: messages.anthropic_shape}  # error shapes by path prefix
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
            admin_keys.create_key,
            admin_keys.list_keys,
            admin_keys.get_key,
            admin_keys.update_key,
            admin_keys.rotate_key,
            admin_keys.revoke_key,
            admin_keys.audit_log,
            admin_keys.control_status,
            admin_tenants.create_tenant,
            admin_tenants.update_tenant,
            admin_tenants.list_tenants,
            admin_tenants.get_tenant,
            webhooks.webhook_deliveries,
            usage_routes.admin_usage,
            usage_routes.tenant_usage,
            openapi.openapi_document,
            files.upload_handler(config.batch.max_file_bytes),
            files.list_files,
            files.retrieve_file,
            files.delete_file,
            files.file_content,
            batches.create_batch,
            batches.list_batches,
            batches.retrieve_batch,
            batches.cancel_batch,
            console_router(),  # the admin console's HTML pages under /console
        ],
        lifespan=[lifespan],
        # Outermost first: a keyed request runs inside its own task, where no disconnect
        # reaches ``finish_abandoned`` (gateway/http/idempotency.py). JWT keys before
        # idempotency, which authenticates too.
        middleware=[fetch_unknown_jwt_keys, idempotency_keys(by_prefix=shapes), finish_abandoned],
        exception_handlers=exception_handlers(by_prefix=shapes),
        request_max_body_size=config.server.max_body_bytes,
        openapi_config=None,
        logging_config=None,
    )
    openapi.publish(app)  # after the routes exist: the document lists them
    return app
