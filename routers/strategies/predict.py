"""Predictions that strategies (and the routing simulator in ``bench/``) share: latency from
a target's EWMAs, cost from its price, and the formatting used in route reasons.

Rules, stated once:
- TTFT is the EWMA of time to first token (``None``: never measured).
- Total latency = TTFT + time per output token x expected output tokens. A missing
  time-per-token counts as 0: non-streamed answers fold generation into their "TTFT"
  (time to the whole answer), so TTFT alone is then the best estimate there is.
- Cost = input price x prompt tokens + output price x expected output tokens, in USD;
  ``None`` for a target without a price.
"""

from __future__ import annotations

from core.routing import RouteRequest, TargetHealth
from routers.targets import Target


def ttft_s(health: TargetHealth) -> float | None:
    """Predicted seconds to the first token, or None when unmeasured."""
    return health.ttft_s


def total_s(req: RouteRequest, health: TargetHealth) -> float | None:
    """Predicted seconds to the whole answer, or None when TTFT is unmeasured."""
    if health.ttft_s is None:
        return None
    return health.ttft_s + (health.tpot_s or 0.0) * req.output_tokens


def cost_usd(req: RouteRequest, target: Target) -> float | None:
    """Estimated USD for this request on ``target``; None when the target has no price."""
    if target.price is None:
        return None
    prompt, output, _cached = target.price.per_token()
    return prompt * req.prompt_tokens + output * req.output_tokens


def fmt_s(seconds: float) -> str:
    """``420ms`` below a second, ``1.2s`` above: what reasons print."""
    if seconds < 1.0:
        return f"{seconds * 1000:.0f}ms"
    return f"{seconds:.1f}s"


def fmt_usd(usd: float) -> str:
    """``$0.0002``, ``$0.013``, ``$1.25``: two significant digits below a dollar."""
    if usd == 0:
        return "$0"
    if usd >= 1:
        return f"${usd:.2f}"
    return f"${usd:.2g}" if usd >= 1e-4 else f"${usd:.1e}"
