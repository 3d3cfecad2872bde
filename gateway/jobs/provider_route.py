"""Which batches run through a provider's own batch API, and that API's client
(docs/batches.md, "Through the provider's batch API").

A batch qualifies when its endpoint is ``/v1/chat/completions`` and every request's alias
has, as its first target (the first the runtime resolved: a provider skipped for a
missing key is not one), the same provider and upstream model, on a provider configured
with ``batch_api: true`` (``type: openai`` or ``anthropic``), which the batch's tenant may
reach (not ``local_only``, within ``providers``/``deny_providers``). That target is the
route: there is no fallback to the alias's other targets (the provider's batch holds each
request until it answers or the batch ends). Every other batch runs item by item.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from core.config import AnthropicProviderConfig, OpenAIProviderConfig
from core.config_tenants import TenantConfig
from core.remote_batch import RemoteResult, RemoteStatus
from core.tenancy import Principal
from gateway.process.runtime import Runtime
from policies.jobs.jsonl import Request
from policies.jobs.usage import requested_model
from providers.anthropic.batch_api import AnthropicBatchApi
from providers.http import HttpProvider
from providers.openai.batch_api import OpenAIBatchApi
from routers.targets import Target

CHAT = "/v1/chat/completions"


class BatchApi(Protocol):
    """What the provider-batch loop needs from a provider's batch API client."""

    def prepare(self, body: bytes, upstream_model: str) -> bytes: ...

    async def submit(self, requests: Sequence[tuple[str, bytes]], batch_id: str) -> str: ...

    async def status(self, remote_id: str) -> RemoteStatus: ...

    async def results(
        self, remote_id: str, bodies: Mapping[str, bytes], created: int = 0
    ) -> dict[str, RemoteResult]: ...

    async def cancel(self, remote_id: str) -> None: ...


def batch_api_target(runtime: Runtime, alias: str | None) -> Target | None:
    """``alias``'s first target when its provider has ``batch_api: true``, else None."""
    targets = runtime.targets.get(alias or "") or []
    if not targets:
        return None
    config = runtime.config_of(targets[0])
    if isinstance(config, OpenAIProviderConfig | AnthropicProviderConfig) and config.batch_api:
        return targets[0]
    return None


def _reachable(tenant: TenantConfig | None, provider: str) -> bool:
    if tenant is None:
        return True
    if tenant.local_only or provider in tenant.deny_providers:
        return False
    return tenant.providers is None or provider in tenant.providers


def provider_for(
    runtime: Runtime, principal: Principal, endpoint: str, requests: Sequence[Request]
) -> str | None:
    """The provider whose batch API runs this batch, or None (item by item)."""
    if endpoint != CHAT or not requests:
        return None
    chosen: tuple[str, str] | None = None
    for request in requests:
        target = batch_api_target(runtime, request.model)
        if target is None:
            return None
        pair = (target.provider_name, target.model)
        if chosen is not None and pair != chosen:
            return None
        chosen = pair
    assert chosen is not None
    return chosen[0] if _reachable(runtime.auth.tenant_config(principal), chosen[0]) else None


def target_of(runtime: Runtime, provider: str, bodies: Sequence[bytes]) -> Target | None:
    """The target a started batch's requests go to now: the first request's alias's
    batch-API target, when it is still on ``provider`` (None: not any more)."""
    alias = requested_model(bodies[0]) if bodies else None
    target = batch_api_target(runtime, alias)
    return target if target is not None and target.provider_name == provider else None


def api_for(runtime: Runtime, target: Target) -> BatchApi | None:
    """The batch API client of ``target``'s provider (its adapter's HTTP client and key)."""
    adapter, config = target.provider, runtime.config_of(target)
    if not isinstance(adapter, HttpProvider):
        return None
    if isinstance(config, OpenAIProviderConfig):
        return OpenAIBatchApi(
            target.provider_name,
            adapter.client,
            adapter.base_url,
            adapter.api_key,
            adapter.extra_headers,
            config.timeout_s,
        )
    if isinstance(config, AnthropicProviderConfig):
        return AnthropicBatchApi(
            target.provider_name, adapter.client, config, adapter.api_key, adapter.base_url
        )
    return None
