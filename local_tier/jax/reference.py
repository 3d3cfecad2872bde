"""A plain NumPy forward pass of the Llama architecture, for tests only.

It is written independently of ``model.py`` on purpose: it uses the GGUF tensors exactly as
stored (Q and K in llama.cpp's permuted order) with interleaved RoPE (rotating pairs
``(2i, 2i+1)``), separate Q/K/V and gate/up matrices, the untransposed embedding, and full
causal attention recomputed from scratch, and separate biases where the model has them.
Agreement with ``model.py`` (split-half RoPE on un-permuted weights, fused biases, paged
cache) therefore checks the un-permutation, the cache and the bucketing at once. Only the RoPE
frequencies are shared (``rope.py``, checked on its own against Hugging Face's rules).
"""

from __future__ import annotations

import numpy as np

from local_tier.jax.gguf_loader import ModelTensors
from local_tier.jax.rope import inv_frequencies


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    out: np.ndarray = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w
    return out


def _rope_interleaved(x: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """x: (T, heads, hd) at positions 0..T-1; rotates pairs (2i, 2i+1) by pos * inv[i]."""
    t = x.shape[0]
    ang = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]  # (T, hd/2)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = odd * cos + even * sin
    return out


def _proj(h: np.ndarray, t: dict[str, np.ndarray], name: str) -> np.ndarray:
    """``h @ W^T (+ b)`` for tensor ``name`` (``blk.i.attn_q``), bias only if the model has one."""
    out = h @ t[f"{name}.weight"].astype(np.float64).T
    bias = t.get(f"{name}.bias")
    return out if bias is None else out + bias.astype(np.float64)


def reference_logits(model: ModelTensors, tokens: list[int]) -> np.ndarray:
    """Logits (T, vocab) for every position of ``tokens``, computed in float64 for accuracy.
    ``model`` is a ``GGUFModel`` or an ``HFModel`` (tensors in GGUF naming and order)."""
    hp, t = model.hparams, model.tensors
    inv = inv_frequencies(hp, t.get("rope_freqs.weight")).astype(np.float64)
    nh, nkv, hd = hp.n_heads, hp.n_kv_heads, hp.head_dim
    emb = t["token_embd.weight"].astype(np.float64)  # (vocab, d_model)
    x = emb[np.asarray(tokens)]
    n = len(tokens)
    causal = np.tril(np.ones((n, n), dtype=bool))
    for i in range(hp.n_layers):

        def w(name: str, i: int = i) -> np.ndarray:
            return t[f"blk.{i}.{name}.weight"].astype(np.float64)

        h = _rms(x, w("attn_norm"), hp.rms_eps)
        q = _rope_interleaved(_proj(h, t, f"blk.{i}.attn_q").reshape(n, nh, hd), inv)
        k = _rope_interleaved(_proj(h, t, f"blk.{i}.attn_k").reshape(n, nkv, hd), inv)
        v = _proj(h, t, f"blk.{i}.attn_v").reshape(n, nkv, hd)
        heads = []
        for head in range(nh):
            kv = head // (nh // nkv)  # GQA: consecutive query heads share one KV head
            s = q[:, head] @ k[:, kv].T / np.sqrt(hd)
            s = np.where(causal, s, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            heads.append(p @ v[:, kv])
        x = x + _proj(np.concatenate(heads, axis=-1), t, f"blk.{i}.attn_output")
        h = _rms(x, w("ffn_norm"), hp.rms_eps)
        gate, up = h @ w("ffn_gate").T, h @ w("ffn_up").T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w("ffn_down").T
    x = _rms(x, t["output_norm.weight"].astype(np.float64), hp.rms_eps)
    out = t.get("output.weight", t["token_embd.weight"]).astype(np.float64)
    return np.asarray(x @ out.T)
