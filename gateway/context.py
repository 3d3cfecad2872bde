"""Per-request bookkeeping: the request id, timings, the trace, and the one log line."""

from __future__ import annotations

import os
import re
import time
from typing import Any

import structlog
from litestar import Request

from core.errors import GatewayError
from core.protocols import CallContext
from core.wire import Usage
from routers.executor import Trace
from routers.targets import Target

_log = structlog.get_logger("switchyard")
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def new_request_id(request: Request[Any, Any, Any]) -> str:
    """The client's ``x-request-id`` when it is a sane token, else a fresh one."""
    supplied = request.headers.get("x-request-id")
    if supplied and _SAFE_ID.match(supplied):
        return supplied
    return "req_" + os.urandom(12).hex()


class RequestRecord:
    """Collects what one request did and writes ``request.completed`` exactly once."""

    def __init__(self, request: Request[Any, Any, Any], endpoint: str) -> None:
        self.request_id = new_request_id(request)
        request.scope.setdefault("state", {})["request_id"] = self.request_id
        self.endpoint = endpoint
        self.started = time.perf_counter()
        self.model: str | None = None
        self.stream = False
        self.trace = Trace()
        self.usage: Usage | None = None
        self.ttft_s: float | None = None
        self._done = False

    def call_context(self, target: Target, raw: bytes) -> CallContext:
        """What one call to ``target`` needs; ``raw`` is the client's body, for passthrough."""
        return CallContext(
            request_id=self.request_id,
            upstream_model=target.model,
            timeouts=target.timeouts,
            raw_body=raw,
        )

    def first_byte(self) -> None:
        if self.ttft_s is None:
            self.ttft_s = time.perf_counter() - self.started

    def headers(self) -> dict[str, str]:
        """Response headers that say what happened."""
        headers = {"x-request-id": self.request_id}
        served = self.trace.served_by
        if served is not None:
            headers["x-switchyard-provider"] = served.provider_name
            headers["x-switchyard-upstream-model"] = served.model
            headers["x-switchyard-attempts"] = str(len(self.trace.attempts))
            headers["x-switchyard-route-reason"] = self.trace.route_reason()
        return headers

    def finish(self, status: int, error: GatewayError | None = None) -> None:
        if self._done:
            return
        self._done = True
        served = self.trace.served_by
        usage = self.usage
        latency = time.perf_counter() - self.started
        _log.info(
            "request.completed",
            request_id=self.request_id,
            endpoint=self.endpoint,
            model=self.model,
            provider=served.provider_name if served else None,
            upstream_model=served.model if served else None,
            status=status,
            stream=self.stream,
            attempts=len(self.trace.attempts),
            fallbacks=self.trace.fallbacks,
            latency_ms=round(latency * 1000, 2),
            ttft_ms=round((self.ttft_s if self.ttft_s is not None else latency) * 1000, 2),
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            cached_tokens=usage.cached_tokens if usage else None,
            error=error.code or type(error).__name__ if error else None,
        )
