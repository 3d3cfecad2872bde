"""Metrics mappings per serving engine: where each engine puts running and waiting requests,
KV use, prefix-cache counts, KV pool geometry and TTFT on its Prometheus page
(``spec`` for the vocabulary, one module per engine, ``registry.mapping_for(kind)``)."""

from local_tier.engines.registry import KINDS, MAPPINGS, EngineKind, mapping_for
from local_tier.engines.spec import EngineMapping

__all__ = ["KINDS", "MAPPINGS", "EngineKind", "EngineMapping", "mapping_for"]
