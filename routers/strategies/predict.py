"""Predictions that strategies (and the routing simulator in ``bench/``) share: latency from
a target's EWMAs, cost from its price, and the formatting used in route reasons.

Rules, stated once:
- TTFT = (``ttft_base_s`` + ``ttft_per_token_s`` x the request's prompt tokens) x
  ``ttft_load_factor``: the target's fitted no-load TTFT model (``policies.latency``)
  times what its in-flight requests add now (``policies.load``), or that no-load TTFT
  plus the wait for a slot (``ttft_queue_s``, ``policies.slots``) where that is longer;
  before a model is fitted, the EWMA of time to first token the same way; either times the
  target's cut penalty (``policies.cuts``: attempts given up on at their first-token
  deadline) when the request's prompt is as large as the ones cut. Never measured: the
  longest recently cut wait times the penalty, else ``None`` (unmeasured).
- Tail TTFT (``ttft_tail_s``) = TTFT x exp(z s - s^2 / 2) (``core.routing.
  ttft_quantile_s``), s being the spread for the prompt's length (``TargetHealth.
  spread_for``), the RMS of the log prediction error: the
  TTFT that only one request in ``1 / (1 - Phi(z))`` exceeds, were TTFT log-normal with the
  predicted mean (z = 1.28: the 90th percentile; z = 0: the prediction itself). The
  prediction is a mean (least squares in seconds), so its median is exp(s^2 / 2) below it;
  a tail of TTFT x exp(z s) counted that twice (13% too long at s = 0.5, 28% at 0.7: end
  to end it took the mid-priced target off 3 s RAG requests it met). Multiplicative,
  because latency noise grows with the latency (a long prompt's TTFT varies by more
  seconds than a short one's). It still errs on the safe side: the RMS counts a biased
  prediction's bias as spread too, and a spread past z counts as z. An unmeasured spread
  counts as 0 (the tail is the prediction).
- Total latency = TTFT (at tail z) + time per output token x expected output tokens. A
  missing
  time-per-token counts as 0: non-streamed answers fold generation into their "TTFT"
  (time to the whole answer), so TTFT alone is then the best estimate there is.
- Cost = input price x prompt tokens + output price x expected output tokens, in USD;
  ``None`` for a target without a price.
"""

from __future__ import annotations

import msgspec

from core.routing import RouteRequest, TargetHealth, ttft_quantile_s
from routers.targets import Target

P90_Z = 1.2816  # the standard normal's 90th percentile
RESERVE_Z = 2.3263  # what a rescue is reserved: its p99 TTFT (``deadlines``)
# The prefill a rescue is reserved at least, per prompt token, for a prompt longer than
# its fit's slope is known for (``as_rescue``): 10,000 tokens a second, what a managed API
# or a GPU serving a mid-sized model prefills at; faster ones are learnt once seen.
UNSEEN_PREFILL_S_PER_TOKEN = 1e-4


def ttft_s(req: RouteRequest, health: TargetHealth) -> float | None:
    """Predicted seconds to the first token of ``req``, or None when unmeasured."""
    penalty = health.ttft_penalty if health.penalty_covers(req.prompt_tokens) else 1.0
    if health.ttft_base_s is not None and health.ttft_per_token_s is not None:
        no_load = health.ttft_base_s + health.ttft_per_token_s * req.prompt_tokens
        return _loaded(no_load, health) * penalty
    if health.ttft_s is not None:
        return _loaded(health.ttft_s, health) * penalty
    if health.ttft_floor_s is not None:
        return health.ttft_floor_s * health.ttft_penalty
    return None


def _loaded(no_load_s: float, health: TargetHealth) -> float:
    """A no-load TTFT at the target's load now: its load factor or its slot wait, the
    longer (two reads of one queue; see the module docstring)."""
    return max(no_load_s * health.ttft_load_factor, no_load_s + health.ttft_queue_s)


def ttft_tail_s(req: RouteRequest, health: TargetHealth, z: float) -> float | None:
    """The ``z`` tail of ``req``'s TTFT (see the module docstring), or None when
    unmeasured."""
    first = ttft_s(req, health)
    if first is None:
        return None
    return ttft_quantile_s(first, health.spread_for(req.prompt_tokens) or 0.0, z)


def as_rescue(req: RouteRequest, health: TargetHealth) -> TargetHealth:
    """``health`` as a rescue is judged for ``req``: with its slow fit's model
    (``TargetHealth.ttft_steady_*``) when that one's p99 for ``req`` is the longer.

    Why: a rescue's p99 is what the target before it is cut in time for, and the
    prediction's (a fit over ~19 samples) swings with its last samples: end to end,
    premium's predicted p99 for a chat prompt ranged 0.67-1.1 s (5th-95th percentile)
    around a true 0.80 s, and 337 of 785 cuts left premium less than its true p99; 11 of
    those rescues missed (3.3%, against the 1% planned). The slow fit (~100 samples) is
    steadier; the longer of the two keeps a real slow-down the fast fit has seen.

    A prompt longer than the slow fit's slope is known for (``ttft_steady_reach_tokens``)
    is reserved a prefill of at least ``UNSEEN_PREFILL_S_PER_TOKEN`` for each token past
    that reach: the slope starts at 0 and is learnt from the prompts seen, so it errs low
    on longer ones. End to end, premium rescued 4,000-token RAG prompts 1-2 s into a run,
    after chat prompts only: p99 reserved 0.73 s, served 1.0 s, two misses in every run
    since session 22. Only the tokens past the reach: the floor on the whole prompt cost
    the routing simulator 10% more per request for the same attainment."""
    if health.ttft_steady_base_s is None or health.ttft_steady_per_token_s is None:
        return health
    steady = msgspec.structs.replace(
        health,
        ttft_base_s=health.ttft_steady_base_s,
        ttft_per_token_s=health.ttft_steady_per_token_s,
        ttft_band_spreads=health.ttft_steady_band_spreads,
    )
    fast, slow = ttft_tail_s(req, health, RESERVE_Z), ttft_tail_s(req, steady, RESERVE_Z)
    chosen = steady if fast is None or (slow is not None and slow > fast) else health
    return _unseen_prefill(req, chosen)


def _unseen_prefill(req: RouteRequest, health: TargetHealth) -> TargetHealth:
    """``health`` where ``req``'s prompt is longer than the slope is known for (see
    ``as_rescue``): the tokens past the reach at ``UNSEEN_PREFILL_S_PER_TOKEN`` at least,
    as the slope for the whole prompt that adds as much."""
    reach = health.ttft_steady_reach_tokens
    slope = health.ttft_per_token_s
    tokens = req.prompt_tokens
    if reach is None or slope is None or tokens <= reach or slope >= UNSEEN_PREFILL_S_PER_TOKEN:
        return health
    unseen = (UNSEEN_PREFILL_S_PER_TOKEN - slope) * (tokens - reach) / tokens
    return msgspec.structs.replace(health, ttft_per_token_s=slope + unseen)


def total_s(req: RouteRequest, health: TargetHealth, z: float = 0.0) -> float | None:
    """Predicted seconds to the whole answer (its TTFT at tail ``z``), or None when TTFT is
    unmeasured."""
    first = ttft_tail_s(req, health, z)
    if first is None:
        return None
    # The n answers of one request decode side by side: the time is one answer's.
    return first + (health.tpot_s or 0.0) * req.answer_tokens


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
