"""RoPE inverse frequencies, computed once at load (NumPy; no JAX).

``inv_frequencies`` gives the ``head_dim / 2`` frequencies that rotate dimension pair ``i`` by
``position * inv[i]``: ``base ** (-2i / head_dim)``, then scaled as the model asks:

- ``linear``: every frequency divided by ``factor``;
- ``llama3`` (Llama 3.1+; Hugging Face's ``_compute_llama3_parameters``): wavelengths shorter
  than ``original_context / high_freq_factor`` are kept, those longer than
  ``original_context / low_freq_factor`` are divided by ``factor``, and those in between are
  interpolated smoothly between the two;
- a GGUF ``rope_freqs.weight`` tensor (llama.cpp's form of the Llama 3.1 rule) divides each
  frequency by its entry.

Computed in float64 and rounded once to float32: the model and the NumPy reference use the
same values, so RoPE never differs between them.
"""

from __future__ import annotations

import numpy as np

from local_tier.jax.gguf_loader import HParams, ModelLoadError, RopeScaling

SUPPORTED_SCALING = ("linear", "llama3")


def inv_frequencies(hp: HParams, freq_factors: np.ndarray | None = None) -> np.ndarray:
    """(head_dim // 2,) float32 inverse frequencies for ``hp`` (see the module docstring)."""
    hd = hp.head_dim
    inv = 1.0 / hp.rope_base ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    scaling = hp.rope_scaling
    if scaling is not None:
        inv = _scaled(inv, scaling)
    if freq_factors is not None:
        if freq_factors.shape != inv.shape:
            raise ModelLoadError(f"rope_freqs has shape {freq_factors.shape}; expected {inv.shape}")
        inv = inv / freq_factors.astype(np.float64)
    return inv.astype(np.float32)


def _scaled(inv: np.ndarray, s: RopeScaling) -> np.ndarray:
    if s.kind == "linear":
        return inv / s.factor
    if s.kind == "llama3":
        return _llama3(inv, s)
    raise ModelLoadError(
        f"RoPE scaling {s.kind!r} is not supported (supported: {', '.join(SUPPORTED_SCALING)})"
    )


def _llama3(inv: np.ndarray, s: RopeScaling) -> np.ndarray:
    low_wavelen = s.original_context / s.low_freq_factor
    high_wavelen = s.original_context / s.high_freq_factor
    wavelen = 2 * np.pi / inv
    smooth = (s.original_context / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * inv / s.factor + smooth * inv
    out = np.where(wavelen > low_wavelen, inv / s.factor, inv)
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, out)
