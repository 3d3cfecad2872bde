"""The routing page's "route explain" form: its fields read and checked, then the very
planner run ``switchyard route explain`` uses (``gateway.request.explain``), here with this
replica's live health (breakers, latency estimates, saturation)."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from core.errors import GatewayError
from gateway.process.state import GatewayState
from gateway.request.explain import Explanation, explain_route, route_for


class ExplainForm(msgspec.Struct, kw_only=True):
    """What the form asks (strings as typed; checked by ``explain``)."""

    model: str = ""
    tenant: str = ""
    prompt_tokens: str = "500"
    slo_ttft_ms: str = ""


def read_form(params: Mapping[str, str]) -> ExplainForm:
    return ExplainForm(
        model=params.get("model", ""),
        tenant=params.get("tenant", ""),
        prompt_tokens=params.get("prompt_tokens", "500") or "500",
        slo_ttft_ms=params.get("slo_ttft_ms", ""),
    )


def _number(text: str, name: str, *, integer: bool) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        value = -1
    if not 0 < value < 1e9:
        kind = "a whole number" if integer else "a number"
        raise ValueError(f"{name} must be {kind} above 0; got {text[:32]!r}")
    return value


def explain(state: GatewayState, form: ExplainForm) -> Explanation:
    """The plan for the form's request. ``ValueError`` (a bad field, an unknown alias or
    tenant) or ``GatewayError`` (the planner: no target could ever serve it) say why not."""
    prompt = int(_number(form.prompt_tokens, "prompt tokens", integer=True))
    slo = _number(form.slo_ttft_ms, "TTFT objective", integer=False) if form.slo_ttft_ms else None
    runtime = state.runtime
    route = route_for(
        runtime.config, form.model, form.tenant or None, prompt_tokens=prompt, slo_ttft_ms=slo
    )
    return explain_route(runtime, route, state.trackers.view(route))


def explain_from_query(
    state: GatewayState, params: Mapping[str, str]
) -> tuple[ExplainForm, Explanation | None, str | None]:
    """(the form as given, the plan or None, the problem or None); nothing is explained
    until an alias is chosen."""
    form = read_form(params)
    if not form.model:
        return form, None, None
    try:
        return form, explain(state, form), None
    except (ValueError, GatewayError) as exc:
        return form, None, getattr(exc, "message", None) or str(exc)
