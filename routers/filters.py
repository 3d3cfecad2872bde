"""Capability filters: drop targets that cannot express a request. Pure functions."""

from __future__ import annotations

from collections.abc import Sequence

from core.errors import InvalidRequestError
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
