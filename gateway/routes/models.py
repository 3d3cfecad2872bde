"""``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /healthz`` and ``GET /readyz``."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get

from core.errors import ModelNotFoundError
from core.wire import ModelCard, ModelList, encoder
from gateway.process.state import GatewayState

_JSON = "application/json"


def _state(request: Request[Any, Any, Any]) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


def _cards(request: Request[Any, Any, Any]) -> list[ModelCard]:
    """The aliases the caller may use (401 without credentials when tenants exist)."""
    state = _state(request)
    runtime = state.runtime
    principal = runtime.auth.authenticate(request.headers)
    return [
        ModelCard(alias, state.created, m.owned_by)
        for alias, m in runtime.config.models.items()
        if runtime.auth.may_use(principal, alias)
    ]


@get("/v1/models")
async def list_models(request: Request[Any, Any, Any]) -> Response[bytes]:
    body = encoder.encode(ModelList(_cards(request)))
    return Response(body, media_type=_JSON)


@get("/v1/models/{model_id:path}")
async def get_model(request: Request[Any, Any, Any], model_id: str) -> Response[bytes]:
    model_id = model_id.lstrip("/")
    for card in _cards(request):
        if card.id == model_id:
            return Response(encoder.encode(card), media_type=_JSON)
    raise ModelNotFoundError(f"The model '{model_id}' does not exist.", param="model")


@get("/healthz")
async def healthz() -> Response[bytes]:
    """Liveness: the process answers. Readiness is /readyz."""
    return Response(b'{"status":"ok"}', media_type=_JSON)


@get("/readyz")
async def readyz(request: Request[Any, Any, Any]) -> Response[bytes]:
    """200 once every enabled provider is ready (local models loaded, compiled, probed)."""
    state = _state(request)
    providers = {name: p.is_ready() for name, p in state.runtime.providers.items()}
    failed = state.startup_failed()
    ready = all(providers.values()) and failed is None
    body = {
        "status": "ready" if ready else ("failed" if failed else "starting"),
        "providers": providers,
        "disabled": {d.name: d.reason for d in state.runtime.disabled},
    }
    if failed is not None:
        body["error"] = str(failed)
    return Response(encoder.encode(body), media_type=_JSON, status_code=200 if ready else 503)
