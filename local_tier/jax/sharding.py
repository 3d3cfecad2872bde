"""Tensor parallelism: the device mesh, and where every weight and cache array lives on it.

With ``tensor_parallel: N`` one engine runs on a 1-D ``Mesh`` of N devices (axis ``"tp"``),
Megatron-style, and XLA's GSPMD partitioner inserts the collectives:

- column-parallel: the fused QKV matrix (and its bias) and the fused gate/up matrix are split
  by output columns, so each device computes its own attention heads and its own slice of the
  MLP. ``model.pack_weights`` packs them shard-major (``model.shard_major``) so a device's
  columns are contiguous: ``[its Q heads | its K heads | its V heads]``, ``[its gate | its up]``.
- row-parallel: ``w_o`` and ``w_down`` are split by input rows; each device multiplies its own
  heads' (or MLP slice's) activations and XLA all-reduces the partial sums: two all-reduces of
  ``(B, T, d_model)`` per layer, nothing else.
- the KV cache is split on its kv-heads axis (each device holds its heads' K/V); a query head's
  KV head lies on the same device because both are split into the same contiguous groups.
- norms, RoPE frequencies, the embedding and the output projection are replicated (the logits
  come out whole on every device; see docs for the vocab-sharded alternative).
- int8 ``QuantMatrix`` leaves split like their matrix; a scale lies along the output columns,
  so it is split with a column-parallel matrix and replicated with a row-parallel one.

One device (``tensor_parallel: 1``) keeps today's single-device placement exactly: arrays are
put on that device, not on a one-device mesh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from local_tier.jax import model as M
from local_tier.jax.gguf_loader import HParams
from local_tier.jax.quant import QuantMatrix

P = cast(Any, PartitionSpec)  # untyped in jax's stubs
AXIS = "tp"
REPLICATED = P()
COLUMNS = P(None, AXIS)  # (in, out) matrix split by output columns
ROWS = P(AXIS, None)  # (in, out) matrix split by input rows
VECTOR = P(AXIS)  # a bias or scale along split output columns
# (layers * blocks, kv_heads, block_size, head_dim) split by kv head. Written without the
# trailing Nones: that is how jit reports the step's output caches, and a spelling that
# differs would make the next step (fed those outputs) compile again.
CACHE = P(None, AXIS)


def valid_tensor_parallel(hp: HParams) -> list[int]:
    """Every ``tensor_parallel`` this model can be split into: the divisors of the greatest
    common divisor of its KV heads, heads and MLP width (SmolLM2-135M: 3 KV heads -> [1, 3])."""
    g = math.gcd(hp.n_kv_heads, hp.n_heads, hp.d_ff)
    return [n for n in range(1, g + 1) if g % n == 0]


def check_tensor_parallel(hp: HParams, tp: int) -> None:
    """Raise ``ValueError`` naming ``EngineConfig.tensor_parallel`` unless ``tp`` divides the
    model's KV heads, heads and MLP width (each device must get whole heads)."""
    if tp < 1:
        raise ValueError(f"EngineConfig.tensor_parallel must be >= 1, got {tp}")
    if tp in valid_tensor_parallel(hp):
        return
    raise ValueError(
        f"EngineConfig.tensor_parallel={tp} must divide the model's KV heads ({hp.n_kv_heads}),"
        f" attention heads ({hp.n_heads}) and MLP width ({hp.d_ff}); this model can use "
        f"tensor_parallel in {valid_tensor_parallel(hp)}"
    )


def _matrix(w: Any, spec: PartitionSpec, scale: PartitionSpec) -> Any:
    return QuantMatrix(spec, scale) if isinstance(w, QuantMatrix) else spec


def _opt(x: Any, spec: PartitionSpec) -> PartitionSpec | None:
    return None if x is None else spec


def layer_specs(w: M.LayerWeights) -> M.LayerWeights:
    """The ``PartitionSpec`` of every array of one layer (same pytree shape as ``w``)."""
    return M.LayerWeights(
        attn_norm=REPLICATED,
        ffn_norm=REPLICATED,
        w_qkv=_matrix(w.w_qkv, COLUMNS, VECTOR),
        w_o=_matrix(w.w_o, ROWS, REPLICATED),
        w_gu=_matrix(w.w_gu, COLUMNS, VECTOR),
        w_down=_matrix(w.w_down, ROWS, REPLICATED),
        b_qkv=_opt(w.b_qkv, VECTOR),
        b_o=_opt(w.b_o, REPLICATED),
    )


def weight_specs(w: M.Weights) -> M.Weights:
    """The ``PartitionSpec`` of every array of ``w`` (same pytree shape; ``None`` stays)."""
    return M.Weights(
        emb_t=REPLICATED,
        out_norm=REPLICATED,
        layers=tuple(layer_specs(layer) for layer in w.layers),
        rope_inv=REPLICATED,
        emb_in=_opt(w.emb_in, REPLICATED),
    )


def _is_spec(x: Any) -> bool:
    return isinstance(x, PartitionSpec)  # a tuple: stop the tree walk at it


@dataclass(frozen=True)
class Placement:
    """Where one engine's arrays live: one device, or a ``tp`` mesh over ``devices``."""

    devices: tuple[Any, ...]
    mesh: Mesh | None  # None on one device

    @classmethod
    def on(cls, devices: list[Any] | tuple[Any, ...]) -> Placement:
        """One device: plain placement; several: a 1-D mesh over them, axis ``"tp"``."""
        if not devices:
            raise ValueError("a placement needs at least one device")
        mesh = Mesh(np.asarray(devices, dtype=object), (AXIS,)) if len(devices) > 1 else None
        return cls(tuple(devices), mesh)

    @property
    def tp(self) -> int:
        return len(self.devices)

    @property
    def device(self) -> Any:
        """The first device (its ``platform`` names the backend)."""
        return self.devices[0]

    def sharding(self, spec: PartitionSpec) -> Any:
        """``spec`` on the mesh; on one device, the device itself."""
        return self.device if self.mesh is None else NamedSharding(self.mesh, spec)

    @property
    def replicated(self) -> Any:
        """Where a step's host inputs go: a full copy on every device."""
        return self.sharding(REPLICATED)

    @property
    def cache(self) -> Any:
        """The KV caches' sharding: split by kv head."""
        return self.sharding(CACHE)

    def put_weights(self, w: M.Weights) -> M.Weights:
        """Copy host weights to the devices, each array split as ``weight_specs`` says."""
        if self.mesh is None:
            return cast(M.Weights, jax.device_put(w, self.device))
        mesh = self.mesh
        shardings = jax.tree_util.tree_map(
            lambda s: NamedSharding(mesh, s), weight_specs(w), is_leaf=_is_spec
        )
        return cast(M.Weights, jax.device_put(w, shardings))


def as_placement(where: Any) -> Placement:
    """A ``Placement`` as is; a single JAX device as a one-device placement."""
    return where if isinstance(where, Placement) else Placement.on([where])


__all__ = [
    "AXIS",
    "Placement",
    "as_placement",
    "check_tensor_parallel",
    "layer_specs",
    "valid_tensor_parallel",
    "weight_specs",
]
