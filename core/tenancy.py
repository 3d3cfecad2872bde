"""Who is calling and what one request cost: the shapes shared by the auth guard, quotas,
the usage ledger and the exports."""

from __future__ import annotations

from typing import Literal

from msgspec import Struct

from core.config_tenants import Limits

Via = Literal["open", "api_key", "jwt", "admin"]


class Principal(Struct, frozen=True, kw_only=True):
    """The caller. ``tenant`` is None only on an open gateway (no tenants configured) and
    for the admin key; ``key_id`` names the API key (or the JWT's subject). A control-plane
    key may narrow the tenant's models to ``models`` (None: no narrowing), carries ``tags``
    (its metadata as JSON) into its usage rows, and may have its own ``limits``, which
    replace its tenant's ``key_limits`` for this key (None: the tenant's apply)."""

    tenant: str | None = None
    key_id: str | None = None
    via: Via = "open"
    models: frozenset[str] | None = None
    tags: str | None = None
    limits: Limits | None = None

    @property
    def admin(self) -> bool:
        return self.via == "admin"


OPEN = Principal()
ADMIN = Principal(via="admin", key_id="admin")


class UsageRow(Struct, frozen=True, kw_only=True):
    """One ledger row per request. Times are Unix seconds (UTC); costs in USD.

    ``request_id`` is the gateway's own id (the ledger's key: rows are deduplicated on it);
    ``client_request_id`` is the ``x-request-id`` the client sent, kept for correlation only
    (a client chooses it, so it is never an accounting identity)."""

    request_id: str
    ts: float
    tenant: str | None
    key_id: str | None
    model: str | None  # the alias the client asked for
    provider: str | None
    upstream_model: str | None
    endpoint: str = "chat"
    stream: bool = False
    status: int = 200
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    ttft_ms: float | None = None
    latency_ms: float = 0.0
    queue_ms: float = 0.0
    attempts: int = 0
    fallbacks: int = 0
    cache_hit: bool = False
    client_request_id: str | None = None
    usage_estimated: bool = False  # a cut stream: the prompt estimate + the text streamed
    tags: str | None = None  # the API key's metadata, JSON (keys sorted); None when it has none
