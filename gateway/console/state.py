"""The gateway's parts a console handler reads, from the app's state."""

from __future__ import annotations

from typing import Any

from litestar import Request

from gateway.process.reload import Reloader
from gateway.process.state import GatewayState
from gateway.telemetry.recent import RecentRequests


def state_of(request: Request[Any, Any, Any]) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


def recent_of(request: Request[Any, Any, Any]) -> RecentRequests:
    recent: RecentRequests = request.app.state.telemetry.recent
    return recent


def reloader_of(request: Request[Any, Any, Any]) -> Reloader | None:
    reloader: Reloader | None = getattr(request.app.state, "reloader", None)
    return reloader
