"""Admin routes (admin key only): ``POST /admin/reload``, ``GET /admin/targets`` and
``GET /admin/tenants/{tenant}/quota``."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, get, post

from core.errors import InvalidRequestError, ModelNotFoundError, ServiceUnavailableError
from core.routing import RouteRequest
from gateway.http.guard import require_admin
from gateway.process.reload import Reloader
from gateway.process.state import GatewayState
from gateway.process.workers import workers_report
from policies.store.base import StoreUnavailableError

_JSON = "application/json"


def _state(request: Request[Any, Any, Any]) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


@post("/admin/reload", status_code=200)
async def reload_policy(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Reload the policy file now. 400 with every key-path error when it is invalid (the
    old policy keeps serving)."""
    require_admin(request)
    state = _state(request)
    reloader: Reloader | None = getattr(request.app.state, "reloader", None)
    if reloader is None:
        raise InvalidRequestError(
            "This gateway was not started from a policy file; nothing to reload.",
            code="not_reloadable",
        )
    errors = await reloader.reload()
    if errors:
        raise InvalidRequestError(
            "The new policy file is invalid; the previous policy keeps serving: "
            + "; ".join(errors),
            code="invalid_config",
        )
    body = {"status": "reloaded", "models": sorted(state.runtime.targets)}
    return Response(msgspec.json.encode(body), media_type=_JSON)


@get("/admin/targets")
async def list_targets(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Each target's breaker state, latency estimates, saturation and cache hit rate, the
    admission queue's depth per tenant, and each `workers:` process (docs/workers.md)."""
    require_admin(request)
    body = targets_report(_state(request))
    return Response(msgspec.json.encode(body), media_type=_JSON)


def targets_report(state: GatewayState) -> dict[str, Any]:
    """``GET /admin/targets``'s body (also the admin console's targets page): every target
    once, with the aliases that use it and its health; skipped targets; the queue; the
    worker processes (state, pid, port, devices, restarts, load)."""
    runtime = state.runtime
    seen: dict[str, dict[str, Any]] = {}
    for alias, targets in runtime.targets.items():
        view = state.trackers.view(RouteRequest(model=alias))
        for target in targets:
            entry = seen.get(target.label)
            if entry is None:
                health = view.health(target.label)
                entry = seen[target.label] = {
                    "target": target.label,
                    "provider": target.provider_name,
                    "local": target.local,
                    "ready": target.provider.is_ready(),
                    "aliases": [],
                    **msgspec.to_builtins(health),
                }
            entry["aliases"].append(alias)
    skipped = {
        alias: [msgspec.to_builtins(s) for s in items]
        for alias, items in runtime.skipped.items()
        if items
    }
    queue = {"depth": state.queue.depth, "by_tenant": state.queue.depth_by_tenant()}
    workers = workers_report(state.workers, runtime, state.trackers.capacity)
    return {"targets": list(seen.values()), "skipped": skipped, "queue": queue, "workers": workers}


@get("/admin/goodput")
async def goodput(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Per model alias, over the last minute: finished requests, those with a latency
    objective, those that met it, goodput (met per second) and attainment."""
    require_admin(request)
    meter = _state(request).goodput
    body = {"window_s": meter.window_s, "models": msgspec.to_builtins(meter.snapshot())}
    return Response(msgspec.json.encode(body), media_type=_JSON)


@get("/admin/tenants/{tenant:str}/quota")
async def tenant_quota(
    request: Request[Any, Any, Any], tenant: str, key_id: str | None = None
) -> Response[bytes]:
    """The tenant's (and with ``?key_id=`` that key's) current use of each limit: live
    concurrency leases and the current windows' counters, from the shared store. 404 for
    an unknown tenant, 503 while the store is unreachable."""
    require_admin(request)
    state = _state(request)
    runtime = state.runtime
    if tenant not in runtime.config.tenants:
        error = ModelNotFoundError(f"No tenant named '{tenant}'.", param="tenant")
        error.code = "tenant_not_found"
        raise error
    try:
        record = state.control.index.record(key_id) if state.control and key_id else None
        own = record.limits if record is not None else None  # the key's own, if it has any
        limits = await runtime.quotas.current(tenant, key_id, own)
    except StoreUnavailableError as exc:
        raise ServiceUnavailableError(f"Quota state is unavailable: {exc}") from exc
    body = {"tenant": tenant, "key_id": key_id, "limits": limits}
    return Response(msgspec.json.encode(body), media_type=_JSON)
