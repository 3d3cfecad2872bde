"""What routing decisions are made from: the routing view of a request and each target's
health. Strategies and filters (``routers``) read these; breakers, latency stats and
capacity signals (``policies``, ``local_tier``) produce them."""

from __future__ import annotations

import bisect
import math
from typing import Literal, Protocol

from msgspec import Struct

BreakerState = Literal["closed", "open", "half_open"]


class RouteRequest(Struct, frozen=True, kw_only=True):
    """The parts of a request that routing acts on.

    ``prompt_tokens`` is an estimate (characters / 4 before any tokenizer has seen it).
    ``max_tokens`` bounds each of the ``n`` answers the request asks for.
    ``prefix_hashes`` are chained hashes of the prompt's leading blocks, oldest first: equal
    leading hashes mean an equal leading prefix. SLO fields are milliseconds.
    """

    model: str
    tenant: str | None = None
    prompt_tokens: int = 0
    max_tokens: int | None = None
    n: int = 1
    slo_ttft_ms: float | None = None
    slo_total_ms: float | None = None
    local_only: bool = False
    providers: tuple[str, ...] | None = None  # the tenant's provider allow-list (None: all)
    deny_providers: tuple[str, ...] = ()
    prefix_hashes: tuple[int, ...] = ()

    @property
    def answer_tokens(self) -> int:
        """Expected output tokens of one answer: ``max_tokens``, else 256."""
        return self.max_tokens if self.max_tokens is not None else 256

    @property
    def output_tokens(self) -> int:
        """Expected output tokens of the whole request, all ``n`` answers: what admission
        reserves and what cost predictions charge."""
        return self.answer_tokens * self.n


class TargetHealth(Struct, frozen=True, kw_only=True):
    """One target's state as routing sees it. ``None`` estimates mean "no data yet"."""

    breaker: BreakerState = "closed"
    ttft_s: float | None = None  # EWMA of time to first token
    tpot_s: float | None = None  # EWMA of time per output token
    saturated: bool = False  # local replicas: cannot take more work now
    waiting: int = 0  # requests queued on the replica
    running: int = 0
    kv_usage: float = 0.0  # 0-1
    in_flight: int = 0  # requests the gateway has sent and not yet seen finish
    prefix_blocks: int = 0  # leading blocks of this request's prompt the replica likely holds
    cache_hit_rate: float | None = None
    # TTFT as a function of the prompt (``routers.strategies.predict.ttft_s``): fitted TTFT
    # at an empty prompt and seconds per prompt token; None until fitted (the prediction
    # then falls back to ``ttft_s``).
    ttft_base_s: float | None = None
    ttft_per_token_s: float | None = None
    # Root mean square of the relative TTFT prediction error (0.3: typically 30% off), for
    # tail-aware predictions; None until there is a prediction error to measure. Per band
    # of prompt lengths (``SPREAD_BAND_EDGES``) where measured: read it with ``spread_for``.
    ttft_spread: float | None = None
    ttft_band_spreads: tuple[float, ...] = ()
    # How much longer than at no load the target takes to start a request dispatched now,
    # from its learnt latency-vs-concurrency curve (``policies.load``): 1.0 = as at no load.
    ttft_load_factor: float = 1.0
    # Seconds a request sent now waits for one of the target's slots, where its slots are
    # inferred (``policies.slots``, Little's law): the prediction is the larger of the
    # no-load TTFT x the load factor and the no-load TTFT + this wait.
    ttft_queue_s: float = 0.0
    # The most requests in flight any recent TTFT sample was dispatched with (None: no
    # sample): past it the load factor is extrapolated (``routers.strategies.slo``).
    ttft_load_seen: int | None = None
    # The fewest requests in flight at which that curve reads the target slowed: where its
    # queue starts (None: no slow-down seen). Requests without an objective of their own
    # leave room below it (``SloStrategy.default_reserve``).
    ttft_load_knee: int | None = None
    # Seconds since the target's last TTFT sample (None: unmeasured): how stale its
    # estimates are, for exploration.
    ttft_age_s: float | None = None
    # The same per band of prompt lengths (``SPREAD_BAND_EDGES``; None: no sample there):
    # a target kept busy with short prompts is fresh for them and stale for long ones.
    ttft_band_ages_s: tuple[float | None, ...] = ()
    # The slow fit's no-load model (``policies.ttft_models``: ~100 samples against the
    # prediction's ~19) and its spread per band: a rescue is reserved the longer of the two
    # tails (``routers.strategies.predict.as_rescue``).
    ttft_steady_base_s: float | None = None
    ttft_steady_per_token_s: float | None = None
    ttft_steady_band_spreads: tuple[float, ...] = ()
    # The longest prompt the slow fit's slope is known for (``policies.ttft_fit.
    # reach_tokens``; None: unknown): a rescue for a longer one is reserved a prefill of at
    # least ``predict.UNSEEN_PREFILL_S_PER_TOKEN`` for each token past it (``as_rescue``).
    ttft_steady_reach_tokens: float | None = None
    # From attempts cut at their first-token deadline (``policies.cuts``): a multiplier on
    # the predicted TTFT (1.0: none lately) for prompts of at least
    # ``ttft_penalty_from_tokens`` sent with at least ``ttft_penalty_from_in_flight`` in
    # flight (``penalty_covers``), and the longest wait cut, what an otherwise unmeasured
    # target is predicted at.
    ttft_penalty: float = 1.0
    ttft_floor_s: float | None = None
    ttft_penalty_from_tokens: int = 0
    ttft_penalty_from_in_flight: int = 0
    # Seconds since that penalty was last raised (None: no penalty): how stale the
    # evidence is for prompts it covers, which short-prompt samples say nothing about.
    ttft_penalty_age_s: float | None = None

    def penalty_covers(self, prompt_tokens: int) -> bool:
        """Whether the cut penalty applies to a prompt of ``prompt_tokens`` sent now: as
        long as the cut ones (``ttft_penalty_from_tokens``), at a load as high
        (``ttft_penalty_from_in_flight``)."""
        return (
            prompt_tokens >= self.ttft_penalty_from_tokens
            and self.in_flight >= self.ttft_penalty_from_in_flight
        )

    def age_for(self, prompt_tokens: int) -> float | None:
        """Seconds since the last TTFT sample of a prompt in ``prompt_tokens``'s band,
        else (none there, or no bands) since the target's last one."""
        if self.ttft_band_ages_s:
            age = self.ttft_band_ages_s[spread_band(prompt_tokens)]
            if age is not None:
                return age
        return self.ttft_age_s

    def spread_for(self, prompt_tokens: int) -> float | None:
        """The TTFT spread for a prompt of ``prompt_tokens``: its band's, else the
        target's overall one."""
        if self.ttft_band_spreads:
            return self.ttft_band_spreads[spread_band(prompt_tokens)]
        return self.ttft_spread


UNKNOWN = TargetHealth()

# Lower edges, in prompt tokens, of the bands a target's TTFT spread is measured in: a
# long prompt's TTFT is a noisy start plus a steadier prefill, so its log spread is
# narrower than a short one's (``policies.ttft_fit.band_spreads``).
SPREAD_BAND_EDGES: tuple[int, ...] = (0, 256, 1024, 4096, 16384)


def spread_band(prompt_tokens: float) -> int:
    """Index of the band of ``SPREAD_BAND_EDGES`` holding ``prompt_tokens``."""
    return max(0, bisect.bisect_right(SPREAD_BAND_EDGES, prompt_tokens) - 1)


_MAX_EXPONENT = 50.0


def ttft_quantile_s(mean_s: float, spread: float, z: float) -> float:
    """The TTFT that only one request in ``1 / (1 - Phi(z))`` exceeds (``z >= 0``), were
    TTFT log-normal with mean ``mean_s`` and log spread ``spread``: ``mean_s x exp(z spread
    - spread^2 / 2)``, the median being ``exp(spread^2 / 2)`` below the mean. TTFT
    predictions are means (fitted in seconds) and spreads are log errors, so this is how a
    prediction and its spread become a tail, for strategies and latency stats alike.

    At a fixed mean that quantile peaks at ``spread = z`` and then falls (the mass crowds
    towards 0 under an ever longer tail); a wider spread is more doubt, never a quicker
    target, so past the peak the quantile stays there: ``mean_s x exp(z^2 / 2)`` (at
    ``z = 0``, the mean itself). The exponent is capped: an absurd spread still gives a
    finite time."""
    exponent = z * spread - spread * spread / 2 if spread <= z else z * z / 2
    return mean_s * math.exp(min(exponent, _MAX_EXPONENT))


def ttft_z(mean_s: float, spread: float, seconds: float) -> float:
    """Where ``seconds`` lies, in standard deviations of log TTFT, under the log-normal of
    ``ttft_quantile_s`` (mean ``mean_s``, log spread ``spread``). All inputs positive."""
    return (math.log(seconds / mean_s) + spread * spread / 2) / spread


def ttft_exceeds_p(mean_s: float, spread: float, seconds: float) -> float:
    """The chance that a TTFT log-normal with mean ``mean_s`` and log spread ``spread``
    exceeds ``seconds`` (``ttft_quantile_s`` without its cap: the distribution itself).
    No spread: 1 when ``seconds`` is under the mean, else 0."""
    if seconds <= 0:
        return 1.0
    if spread <= 0 or mean_s <= 0:
        return 1.0 if seconds < mean_s else 0.0
    return 0.5 * math.erfc(ttft_z(mean_s, spread, seconds) / math.sqrt(2.0))


# The size of the blocks prefix-aware routing hashes a prompt in (``routers.prefix``): 64
# characters, about 16 tokens. A replica whose KV blocks are larger only reuses whole ones,
# so the capacity monitor counts matched blocks in its granularity.
PREFIX_BLOCK_CHARS = 64


class HealthView(Protocol):
    """A consistent snapshot of every target's health, read once per routing decision."""

    def health(self, label: str) -> TargetHealth: ...


class AttemptObserver(Protocol):
    """Told about every call to a target (breakers, latency stats, capacity accounting).
    Must not block or raise; ``error`` is the error class name, None on success; ``ttft_s``
    is the time to the first chunk (streams) or to the whole answer."""

    def attempt_started(self, label: str) -> None: ...

    def attempt_finished(
        self, label: str, *, error: str | None, ttft_s: float | None, retryable: bool
    ) -> None: ...
