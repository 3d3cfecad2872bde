"""Build the routing view of a request (``core.routing.RouteRequest``) from the request,
the caller's tenant settings, the alias and the SLO header."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.config import ModelConfig, RoutingConfig
from core.config_tenants import TenantConfig
from core.errors import InvalidRequestError
from core.routing import RouteRequest
from core.wire import ChatRequest, CompletionRequest, TextPart
from routers.prefix import prefix_hashes, prompt_text

SLO_HEADER = "x-switchyard-slo-ttft-ms"
_CHARS_PER_TOKEN = 4  # the usual rule of thumb for English BPE; only an estimate
_TOKENS_PER_MESSAGE = 4  # role and separators in the chat template
DEFAULT_MAX_N = RoutingConfig().max_n
# No model generates more tokens per answer than this (the largest int32, the type most
# engines count tokens in). Above it a limit means nothing, and an unbounded integer would
# overflow the float arithmetic of cost estimates and the quota store.
MAX_OUTPUT_TOKENS = 2**31 - 1


def estimate_prompt_tokens(req: ChatRequest) -> int:
    """A cheap prompt-size estimate (characters / 4) used before any tokenizer sees it."""
    chars = 0
    for message in req.messages:
        content = message.content
        if isinstance(content, str):
            chars += len(content)
        elif content:
            chars += sum(len(p.text) for p in content if isinstance(p, TextPart))
    if req.tools:
        chars += sum(len(str(tool)) for tool in req.tools)
    return chars // _CHARS_PER_TOKEN + _TOKENS_PER_MESSAGE * len(req.messages)


def checked_n(req: ChatRequest | CompletionRequest, max_n: int) -> int:
    """How many answers ``req`` asks for (``n``, default 1); a 400 naming ``n`` above
    ``max_n`` (the value is not echoed: it may have thousands of digits)."""
    n = req.n or 1
    if n > max_n:
        raise InvalidRequestError(f"'n' must be at most {max_n}", param="n")
    return n


def completion_output_tokens(req: CompletionRequest, max_n: int = DEFAULT_MAX_N) -> int:
    """What a legacy completions request may generate, for its admission: ``max_tokens``
    (else 256) for each of its ``n`` answers; the same 400s as a chat request."""
    if req.max_tokens is not None and req.max_tokens > MAX_OUTPUT_TOKENS:
        raise InvalidRequestError(
            f"'max_tokens' must be at most {MAX_OUTPUT_TOKENS}", param="max_tokens"
        )
    per_answer = req.max_tokens if req.max_tokens is not None else 256
    return per_answer * checked_n(req, max_n)


def checked_output_limit(req: ChatRequest) -> int | None:
    """The client's cap on tokens per answer; a 400 naming the field when it is beyond
    ``MAX_OUTPUT_TOKENS``."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = getattr(req, name)
        if value is not None and value > MAX_OUTPUT_TOKENS:
            raise InvalidRequestError(f"'{name}' must be at most {MAX_OUTPUT_TOKENS}", param=name)
    return req.output_limit()


def slo_from_header(headers: Mapping[str, str]) -> float | None:
    """``x-switchyard-slo-ttft-ms`` as a positive number, or a 400 naming the header."""
    value = headers.get(SLO_HEADER)
    if value is None:
        return None
    try:
        parsed = float(value)
    except ValueError:
        parsed = -1.0
    if not parsed > 0:
        raise InvalidRequestError(
            f"{SLO_HEADER} must be a positive number of milliseconds", param=SLO_HEADER
        )
    return parsed


def tenant_constraints(tenant: TenantConfig | None) -> dict[str, Any]:
    """The ``RouteRequest`` fields a tenant's policy sets (residency, provider lists)."""
    if tenant is None:
        return {}
    allow = tuple(tenant.providers) if tenant.providers is not None else None
    return {
        "local_only": tenant.local_only,
        "providers": allow,
        "deny_providers": tuple(tenant.deny_providers),
    }


def route_request(
    req: ChatRequest,
    model: ModelConfig,
    tenant: TenantConfig | None,
    headers: Mapping[str, str],
    *,
    tenant_name: str | None,
    with_prefix: bool,
    max_n: int = DEFAULT_MAX_N,
) -> RouteRequest:
    """The routing view. The TTFT objective comes from the header, else the tenant, else
    the alias; ``with_prefix`` computes prefix hashes (only worth it for local replicas).
    400 for ``n`` above ``max_n`` (``routing.max_n``) or an absurd output limit: checked
    here, before admission reserves ``n`` answers' worth of output tokens."""
    slo = slo_from_header(headers)
    if slo is None and tenant is not None:
        slo = tenant.slo_ttft_ms
    if slo is None:
        slo = model.slo_ttft_ms
    return RouteRequest(
        model=req.model,
        tenant=tenant_name,
        prompt_tokens=estimate_prompt_tokens(req),
        max_tokens=checked_output_limit(req),
        n=checked_n(req, max_n),
        slo_ttft_ms=slo,
        slo_total_ms=model.slo_total_ms,
        prefix_hashes=prefix_hashes(prompt_text(req)) if with_prefix else (),
        **tenant_constraints(tenant),
    )
