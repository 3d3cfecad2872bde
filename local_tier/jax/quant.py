"""int8 weight-only quantization: symmetric, absmax per output channel.

A matrix ``w`` in the engine's ``(in, out)`` layout is stored as ``q`` (int8, same shape) and
``scale`` (fp32, ``(out,)``) with ``w ~= q * scale``: column ``j``'s largest magnitude maps to
127, so each element's error is at most ``scale[j] / 2``. A column of zeros gets scale 0 and
dequantizes to exact zeros. Activations and accumulation are untouched: ``qdot`` converts
``q`` to bf16 (exact: |q| <= 127 fits bf16's 8-bit significand), multiplies with fp32
accumulation as the bf16 path does, and scales the output columns afterwards, which equals
multiplying by the dequantized matrix because the scale is per output column.

On XLA:CPU (jax 0.11) the convert is not fused into the matmul: the step materializes a bf16
copy of each matrix and multiplies that, so int8 saves memory but not time there (see
docs/local_tier_jax.md, "int8 weights"). GPU/TPU compilers fuse such a convert into the matmul
operand load, which is where reading half the bytes pays.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

QMAX = 127  # symmetric range [-127, 127]; -128 is never produced


class QuantMatrix(NamedTuple):
    """An int8 matrix with per-output-column scales (a pytree: it device_puts like an array)."""

    q: Any  # (in, out) int8
    scale: Any  # (out,) fp32


def quantize(w: np.ndarray) -> QuantMatrix:
    """Quantize ``w`` (in, out) to int8 with one scale per output column (absmax / 127)."""
    w32 = np.asarray(w, np.float32)
    absmax = np.abs(w32).max(axis=0)
    scale = (absmax / QMAX).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))  # zero columns: q = 0, scale = 0
    q = np.clip(np.rint(w32 / safe), -QMAX, QMAX).astype(np.int8)
    return QuantMatrix(np.ascontiguousarray(q), scale)


def dequantize(m: QuantMatrix) -> np.ndarray:
    """The fp32 matrix ``q * scale`` (host, numpy)."""
    return np.asarray(m.q, np.float32) * np.asarray(m.scale, np.float32)


def qdot(x: jax.Array, m: QuantMatrix) -> jax.Array:
    """``x @ dequantize(m)`` in fp32: bf16 operands, fp32 accumulation, scaled per column."""
    y = jnp.dot(
        x.astype(jnp.bfloat16), m.q.astype(jnp.bfloat16), preferred_element_type=jnp.float32
    )
    out: jax.Array = y * m.scale
    return out


__all__ = ["QMAX", "QuantMatrix", "dequantize", "qdot", "quantize"]
