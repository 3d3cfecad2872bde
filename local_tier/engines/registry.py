"""The mapping of each engine kind a ``type: vllm`` provider can name in ``engine``."""

from __future__ import annotations

from typing import Literal, get_args

from local_tier.engines.llamacpp import LLAMACPP
from local_tier.engines.sglang import SGLANG
from local_tier.engines.spec import EngineMapping
from local_tier.engines.tgi import TGI
from local_tier.engines.trtllm import TRTLLM
from local_tier.engines.vllm import JAX, VLLM

# The same values as ``core.config.VllmProviderConfig.engine`` (core may not import this).
EngineKind = Literal["vllm", "sglang", "tgi", "trtllm", "llamacpp", "jax"]
KINDS: tuple[str, ...] = get_args(EngineKind)

MAPPINGS: dict[str, EngineMapping] = {
    mapping.kind: mapping for mapping in (VLLM, SGLANG, TGI, TRTLLM, LLAMACPP, JAX)
}


def mapping_for(kind: str) -> EngineMapping:
    """The mapping of engine ``kind``; ``ValueError`` for a kind without one."""
    try:
        return MAPPINGS[kind]
    except KeyError:
        raise ValueError(f"no metrics mapping for engine {kind!r}; known: {KINDS}") from None
