"""Filters run before a strategy: each drops the targets that must not be tried for a
request and says why (``Skipped``). Pure functions; the planner chains them."""

from __future__ import annotations

from collections.abc import Sequence

from core.errors import ContextLengthError, InvalidRequestError
from core.routing import HealthView
from core.wire import ChatRequest, ImagePart
from routers.targets import Skipped, Target


def required_features(req: ChatRequest) -> dict[str, str]:
    """Capability name -> the request parameter that needs it."""
    needs: dict[str, str] = {}
    if req.tools:
        needs["tools"] = "tools"
    if req.response_format is not None and req.response_format.type == "json_schema":
        needs["json_schema"] = "response_format"
    if req.stream:
        needs["streaming"] = "stream"
    if any(
        isinstance(message.content, list)
        and any(isinstance(part, ImagePart) for part in message.content)
        for message in req.messages
    ):
        needs["vision"] = "messages"
    return needs


def filter_capable(
    req: ChatRequest, targets: Sequence[Target]
) -> tuple[list[Target], list[Skipped]]:
    """Split ``targets`` into those whose capabilities cover the request and the rest.

    Raises ``InvalidRequestError`` (param = the request field) when none is capable, since
    no fallback can help a request the model cannot express.
    """
    needs = required_features(req)
    kept: list[Target] = []
    skipped: list[Skipped] = []
    missing: dict[str, str] = {}
    for target in targets:
        lacking = [cap for cap in needs if not getattr(target.provider.capabilities, cap)]
        if lacking:
            skipped.append(Skipped(target.label, f"lacks {', '.join(lacking)}"))
            missing.update({cap: needs[cap] for cap in lacking})
        else:
            kept.append(target)
    if targets and not kept:
        capability, param = next(iter(missing.items()))
        raise InvalidRequestError(
            f"model '{req.model}' does not support {capability}",
            param=param,
            code="unsupported_parameter",
        )
    return kept, skipped


def filter_local(targets: Sequence[Target]) -> tuple[list[Target], list[Skipped]]:
    """Data residency: keep only the team's own hardware. Run on the whole candidate list,
    before anything else, so no fallback can ever reach a managed API."""
    kept = [t for t in targets if t.local]
    skipped = [Skipped(t.label, "not local (data residency)") for t in targets if not t.local]
    return kept, skipped


def filter_tenant(
    allow: Sequence[str] | None, deny: Sequence[str], targets: Sequence[Target]
) -> tuple[list[Target], list[Skipped]]:
    """The tenant's provider allow- and deny-lists (deny wins). Like residency, this runs on
    the whole candidate list, so fallback never reaches a provider the tenant may not use."""
    kept: list[Target] = []
    skipped: list[Skipped] = []
    for target in targets:
        name = target.provider_name
        if name in deny or (allow is not None and name not in allow):
            skipped.append(Skipped(target.label, "provider not allowed for this tenant"))
        else:
            kept.append(target)
    return kept, skipped


def filter_context(
    prompt_tokens: int, output_tokens: int, targets: Sequence[Target]
) -> tuple[list[Target], list[Skipped]]:
    """Drop targets whose ``max_context`` is smaller than prompt + expected output tokens
    (targets with no known limit stay). Raises ``ContextLengthError`` (400) when none fits:
    a longer window elsewhere is the only thing that could have helped."""
    need = prompt_tokens + output_tokens
    kept: list[Target] = []
    skipped: list[Skipped] = []
    for target in targets:
        if target.max_context is not None and need > target.max_context:
            skipped.append(Skipped(target.label, f"context {target.max_context} < {need}"))
        else:
            kept.append(target)
    if targets and not kept:
        largest = max(t.max_context or 0 for t in targets)
        raise ContextLengthError(
            f"This request needs about {need} tokens ({prompt_tokens} in the prompt, "
            f"{output_tokens} to generate); the largest context available is {largest}.",
            # The prompt alone would fit: it is the requested output that does not.
            param="max_tokens" if output_tokens and prompt_tokens <= largest else "messages",
        )
    return kept, skipped


def filter_health(
    targets: Sequence[Target], health: HealthView
) -> tuple[list[Target], list[Skipped], list[Target]]:
    """Drop targets whose breaker is open ("circuit open") and saturated local replicas
    ("saturated"). Returns (kept, skipped, saturated): the saturated ones are also handed
    back so the caller can queue for them when nothing else is left."""
    kept: list[Target] = []
    skipped: list[Skipped] = []
    saturated: list[Target] = []
    for target in targets:
        state = health.health(target.label)
        if state.breaker == "open":
            skipped.append(Skipped(target.label, "circuit open"))
        elif state.saturated:
            skipped.append(Skipped(target.label, "saturated"))
            saturated.append(target)
        else:
            kept.append(target)
    return kept, skipped, saturated
