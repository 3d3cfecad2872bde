"""The local replicas the capacity monitor watches (``local_tier.capacity``): what to watch
for each (``ReplicaSpec``, built from a provider's config) and the state kept per replica
between polls (``Replica``)."""

from __future__ import annotations

from dataclasses import dataclass

from core.config import VllmProviderConfig
from core.config_routing import SaturationConfig
from local_tier.engines import EngineKind, EngineMapping, mapping_for
from local_tier.saturation import SaturationRule
from local_tier.vllm import metrics as vm

_DEFAULT_SATURATION = SaturationConfig()


def metrics_url(config: VllmProviderConfig) -> str:
    """``metrics_url`` if set, else ``base_url`` without a trailing ``/v1``, plus ``/metrics``."""
    if config.metrics_url:
        return config.metrics_url
    base = config.base_url.rstrip("/")
    base = base.removesuffix("/v1")
    return f"{base}/metrics"


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """What to watch for one replica. ``slots`` is its batch size (``--max-num-seqs``) when
    known; otherwise it is learned from polls that show a queue. ``engine`` names the server
    kind, whose metrics mapping reads its page."""

    metrics_url: str
    saturation: SaturationConfig = _DEFAULT_SATURATION
    slots: int | None = None
    engine: EngineKind = "vllm"
    block_size: int = 16  # tokens per KV block until its /metrics says (cache_config_info)

    @classmethod
    def from_provider(cls, config: VllmProviderConfig, slots: int | None = None) -> ReplicaSpec:
        return cls(metrics_url(config), config.saturation, slots, config.engine, config.block_size)


@dataclass
class Replica:
    """Mutable state of one watched replica."""

    spec: ReplicaSpec
    rule: SaturationRule
    mapping: EngineMapping
    snapshot: vm.MetricsSnapshot | None = None
    saturated: bool = True  # until a first fresh poll says otherwise
    in_flight: int = 0
    tokens: int = 0  # prompt tokens of the requests in flight
    in_flight_at_poll: int = 0  # in_flight and tokens when the snapshot's poll started
    tokens_at_poll: int = 0
    learned_slots: int | None = None
    ttft_s: float | None = None  # EWMA
    ttft_totals: tuple[float, float] | None = None
    next_due: float = 0.0
    failures: int = 0  # consecutive failed polls
    last_error: str | None = None
    polls: int = 0  # successful polls

    def slots(self) -> int | None:
        return self.spec.slots if self.spec.slots is not None else self.learned_slots


def watch(spec: ReplicaSpec) -> Replica:
    """Fresh state for a replica to watch (``ValueError`` for an engine without a mapping)."""
    return Replica(spec, SaturationRule(spec.saturation), mapping_for(spec.engine))
