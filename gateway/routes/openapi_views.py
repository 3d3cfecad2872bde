"""Documentation-only shapes: answers of the gateway's own routes that have no wire type
of their own, described for the OpenAPI document (``gateway.routes.openapi_operations``)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from policies.goodput import Goodput
from policies.jobs.outbox import DeliveryRecord


class Health(msgspec.Struct):
    """``GET /healthz``: the process answers."""

    status: Literal["ok"]


class Readiness(msgspec.Struct, omit_defaults=True):
    """``GET /readyz``: 200 once every enabled provider is ready, else 503 with this body."""

    status: Literal["ready", "starting", "failed"]
    providers: dict[str, bool]
    disabled: dict[str, str]
    error: str | None = None


class Reloaded(msgspec.Struct):
    """``POST /admin/reload``: the aliases the new policy serves."""

    status: Literal["reloaded"]
    models: list[str]


class TargetsView(msgspec.Struct):
    """``GET /admin/targets``: each target's health, skipped targets, the queue's depth,
    and the worker processes ``serve`` runs (``workers:``; empty without)."""

    targets: list[dict[str, Any]]
    skipped: dict[str, list[dict[str, Any]]]
    queue: dict[str, Any]
    workers: list[dict[str, Any]] = []


class GoodputView(msgspec.Struct):
    """``GET /admin/goodput``: per alias, the last window's requests, those with a latency
    objective, those that met it, goodput (met per second) and attainment."""

    window_s: int
    models: dict[str, Goodput]


class QuotaView(msgspec.Struct):
    """``GET /admin/tenants/{tenant}/quota``: the current use of each limit."""

    tenant: str
    key_id: str | None
    limits: dict[str, Any]


class WebhookDeliveryLog(msgspec.Struct):
    """``GET /admin/webhook_deliveries``: batch webhook events, newest first."""

    object: Literal["list"]
    data: list[DeliveryRecord]


class TokenCount(msgspec.Struct):
    """``POST /v1/messages/count_tokens``: the estimate quotas reserve."""

    input_tokens: int


class TextCompletion(msgspec.Struct):
    """A legacy completion as the upstream answered it (forwarded as is)."""

    choices: list[dict[str, Any]]
    object: str = "text_completion"
