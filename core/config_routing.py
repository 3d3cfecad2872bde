"""Policy-file sections for routing: strategies per model alias, circuit breakers, retry
budget, admission queue, local-replica saturation, prompt caching and the response cache."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta, Struct

PositiveFloat = Annotated[float, Meta(gt=0)]
NonNegativeFloat = Annotated[float, Meta(ge=0)]
PositiveInt = Annotated[int, Meta(ge=1)]
Fraction = Annotated[float, Meta(ge=0, le=1)]


class _Strict(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    pass


class PriorityStrategy(_Strict, tag="priority", tag_field="type", frozen=True):
    """Targets in the order the file lists them."""


class WeightedStrategy(_Strict, tag="weighted", tag_field="type", frozen=True):
    """First target drawn by the targets' ``weight``; the rest follow by weight too."""


class LeastLatencyStrategy(_Strict, tag="least_latency", tag_field="type", frozen=True):
    """Power of two choices on the predicted latency (EWMA of TTFT and time per token)."""


class LowestCostStrategy(_Strict, tag="lowest_cost", tag_field="type", frozen=True):
    """Cheapest first by price x estimated tokens."""


class SloStrategy(_Strict, tag="slo", tag_field="type", frozen=True):
    """The cheapest target whose predicted TTFT and total latency meet the objective (from
    the request header, the tenant or the alias); if none can, the closest first.
    ``tail_z`` picks the quantile the prediction must meet (1.2816 = p90 of a log-normal
    spread around the prompt-length fit); ``alone_z`` (2.3263 = p99, never below
    ``tail_z``) the one it must meet when no target could still meet the objective after
    the first was cut (an 800 ms request when the quickest target's p99 is 800 ms): a
    miss there is final. The same holds for one target when, cut at its patience, the
    best rescue would also be late more often than ``1 - Phi(alone_z)`` (1%) of the
    time: it is then judged at ``alone_z`` too. ``alone_z`` equal to ``tail_z`` puts
    cost first: every target is judged at its ``tail_z`` quantile alone.

    ``default_ttft_ms``: the TTFT objective routing assumes for requests that set none
    (null: route them by cost alone), so they too stay off targets too loaded to answer in
    time, and leave a target that hangs once the default objective is lost (not after the
    first-token timeout). It does not count in goodput. ``default_reserve``: the slots
    such a request leaves free at a target whose load curve shows where its queue starts
    (``TargetHealth.ttft_load_knee``), for requests with an objective of their own
    (trunk reservation): it is sent there only while it and that many more would still not
    queue (0: it takes the last free slot but never joins the queue; null: no limit).
    Without it they filled the local box's queue and sent 3 s RAG requests, to which the
    box saved ten times as much, to premium.

    Exploration: a request whose objective leaves at least half of itself as slack over
    the cheapest feasible target tries, with probability ``explore_share``, a cheaper
    target predicted to miss whose estimate is at least ``explore_after_s`` old, first,
    with a first-token deadline that leaves the feasible target its p99 TTFT to still
    meet the objective. A target penalised for cut attempts and holding no request is
    probed so without the draw once its last cut is ``recover_after_s`` old (one probe at
    a time), so that a target back from a hang is found again within seconds. 0 turns
    exploration off.

    Hedging: for a request with its own TTFT objective, when the first target has not
    started answering by its p99 TTFT prediction (or by its first-token deadline, if
    sooner), the second target starts alongside it and the first to answer serves; the
    loser is stopped (a managed API still bills its prompt). ``hedge_share`` caps hedges
    at that share of the alias's recent hedgeable requests (plus one per 30 s); 0 (the
    default) turns hedging off."""

    tail_z: Annotated[float, Meta(ge=0)] = 1.2816
    alone_z: Annotated[float, Meta(ge=0)] = 2.3263
    default_ttft_ms: Annotated[float, Meta(gt=0)] | None = 5000.0
    default_reserve: Annotated[int, Meta(ge=0)] | None = 1
    explore_share: Annotated[float, Meta(ge=0, le=0.5)] = 0.05
    explore_after_s: Annotated[float, Meta(ge=0)] = 10.0
    recover_after_s: Annotated[float, Meta(ge=0)] = 3.0
    hedge_share: Annotated[float, Meta(ge=0, le=0.5)] = 0.0


class PrefixAwareStrategy(_Strict, tag="prefix_aware", tag_field="type", frozen=True):
    """For replicas of one local model: score = w_prefix * cached share of the prompt +
    w_queue * (1 - queue share) + w_kv * (1 - KV use), with a cap on any one replica's share
    of in-flight requests so a hot prefix cannot pile onto one replica."""

    w_prefix: NonNegativeFloat = 3.0
    w_queue: NonNegativeFloat = 2.0
    w_kv: NonNegativeFloat = 2.0
    hot_spot_factor: PositiveFloat = 2.0  # max in-flight on one replica vs the mean (+1)


class RoundRobinStrategy(_Strict, tag="round_robin", tag_field="type", frozen=True):
    """Rotate the first place through the targets (the baseline for prefix-aware)."""


StrategyConfig = (
    PriorityStrategy
    | WeightedStrategy
    | LeastLatencyStrategy
    | LowestCostStrategy
    | SloStrategy
    | PrefixAwareStrategy
    | RoundRobinStrategy
)


STRATEGY_NAMES: tuple[str, ...] = tuple(
    str(kind.__struct_config__.tag) for kind in StrategyConfig.__args__
)
STRATEGY_FORMS = (
    "accepted: a name (`strategy: slo`) or a mapping with `type` and that strategy's "
    "settings (`strategy: {type: slo, tail_z: 1.3}`); names: " + ", ".join(STRATEGY_NAMES)
)


def expand_strategy_shorthand(models: Any) -> Any:
    """``models`` from the YAML with ``strategy: <name>`` turned into ``{type: <name>}``
    (that strategy with its default settings); anything else is left for the decoder to
    judge. The README names strategies, so people write the bare name."""
    if not isinstance(models, dict):
        return models
    return {alias: _expand(entry) for alias, entry in models.items()}


def _expand(entry: Any) -> Any:
    if isinstance(entry, dict) and isinstance(entry.get("strategy"), str):
        return {**entry, "strategy": {"type": entry["strategy"]}}
    return entry


def strategy_hint(error: str) -> str:
    """``error`` with the accepted strategy forms appended when it is about a strategy."""
    if ".strategy:" in error or ".strategy.type:" in error:
        return f"{error} ({STRATEGY_FORMS})"
    return error


class BreakerConfig(_Strict, frozen=True):
    """Per-target circuit breaker (opens on either rule; one probe window after cool-down)."""

    failure_rate: Fraction = 0.5
    window_s: PositiveFloat = 30.0
    min_calls: PositiveInt = 10
    consecutive_failures: PositiveInt = 5
    cooldown_s: PositiveFloat = 15.0
    half_open_probes: PositiveInt = 1


class RetryBudgetConfig(_Strict, frozen=True):
    """Retries may add at most ``ratio`` of the recent calls to one target, plus a floor of
    ``min_per_s``, so retries cannot multiply the load on a target that is down."""

    ratio: Fraction = 0.2
    min_per_s: NonNegativeFloat = 1.0
    window_s: PositiveFloat = 10.0


class QueueConfig(_Strict, frozen=True):
    """Requests wait here when every eligible target is saturated."""

    max_size: Annotated[int, Meta(ge=0)] = 256
    deadline_s: PositiveFloat = 10.0  # when neither request, tenant nor alias sets one


class SaturationConfig(_Strict, frozen=True):
    """When a local replica counts as saturated, from its ``/metrics`` and the gateway's own
    in-flight count. Enters at the high marks, leaves below the low marks (hysteresis)."""

    poll_interval_s: PositiveFloat = 0.1
    stale_after_s: PositiveFloat = 1.0
    max_waiting: Annotated[int, Meta(ge=0)] = 0
    kv_high: Fraction = 0.9
    kv_low: Fraction = 0.75
    max_in_flight: PositiveInt | None = None  # None: from the replica's running + waiting only


class PromptCacheConfig(_Strict, frozen=True):
    """Use the providers' prompt caches: Anthropic ``cache_control`` on long stable system
    prompts and tools, OpenAI ``prompt_cache_key`` per tenant, sticky routing of a tenant's
    repeated prefix to the target that cached it."""

    anthropic_cache_control: bool = True
    min_cacheable_chars: PositiveInt = 4096  # ~1,024 tokens, Anthropic's minimum
    openai_prompt_cache_key: bool = True
    sticky_ttl_s: PositiveFloat = 300.0


class ResponseCacheConfig(_Strict, frozen=True):
    """Exact-repeat cache for deterministic requests (temperature 0 or a seed)."""

    enabled: bool = False
    ttl_s: PositiveFloat = 300.0
    max_entries: PositiveInt = 10_000
    max_entry_bytes: PositiveInt = 1 << 20
