"""A plain NumPy forward pass of the Llama architecture, for tests only.

It is written independently of ``model.py`` on purpose: it uses the GGUF tensors exactly as
stored (Q and K in llama.cpp's permuted order) with interleaved RoPE (rotating pairs
``(2i, 2i+1)``), separate Q/K/V and gate/up matrices, the untransposed embedding, and full
causal attention recomputed from scratch. Agreement with ``model.py`` (split-half RoPE on
un-permuted weights, paged cache) therefore checks the un-permutation, the cache and the
bucketing at once.
"""

from __future__ import annotations

import numpy as np

from local_tier.jax.gguf_loader import GGUFModel


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    out: np.ndarray = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w
    return out


def _rope_interleaved(x: np.ndarray, base: float) -> np.ndarray:
    """x: (T, heads, hd) at positions 0..T-1; rotates pairs (2i, 2i+1) by pos * base^(-2i/hd)."""
    t, _, hd = x.shape
    inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]  # (T, hd/2)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = odd * cos + even * sin
    return out


def reference_logits(model: GGUFModel, tokens: list[int]) -> np.ndarray:
    """Logits (T, vocab) for every position of ``tokens``, computed in float64 for accuracy."""
    hp, t = model.hparams, model.tensors
    nh, nkv, hd = hp.n_heads, hp.n_kv_heads, hp.head_dim
    emb = t["token_embd.weight"].astype(np.float64)  # (vocab, d_model)
    x = emb[np.asarray(tokens)]
    n = len(tokens)
    causal = np.tril(np.ones((n, n), dtype=bool))
    for i in range(hp.n_layers):

        def w(name: str, i: int = i) -> np.ndarray:
            return t[f"blk.{i}.{name}.weight"].astype(np.float64)

        h = _rms(x, w("attn_norm"), hp.rms_eps)
        q = _rope_interleaved((h @ w("attn_q").T).reshape(n, nh, hd), hp.rope_base)
        k = _rope_interleaved((h @ w("attn_k").T).reshape(n, nkv, hd), hp.rope_base)
        v = (h @ w("attn_v").T).reshape(n, nkv, hd)
        heads = []
        for head in range(nh):
            kv = head // (nh // nkv)  # GQA: consecutive query heads share one KV head
            s = q[:, head] @ k[:, kv].T / np.sqrt(hd)
            s = np.where(causal, s, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            heads.append(p @ v[:, kv])
        x = x + np.concatenate(heads, axis=-1) @ w("attn_output").T
        h = _rms(x, w("ffn_norm"), hp.rms_eps)
        gate, up = h @ w("ffn_gate").T, h @ w("ffn_up").T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w("ffn_down").T
    x = _rms(x, t["output_norm.weight"].astype(np.float64), hp.rms_eps)
    out = t.get("output.weight", t["token_embd.weight"]).astype(np.float64)
    return np.asarray(x @ out.T)
