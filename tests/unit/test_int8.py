"""int8 weight-only quantization (``local_tier/jax/quant.py``): the round trip's error bound
per output channel, scale shapes, zero columns, the packed layout and its byte count, and the
compiled int8 step on a tiny random model against the NumPy reference forward."""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import msgspec
import numpy as np
import pytest

from core.config import JaxProviderConfig
from local_tier.jax import model as M
from local_tier.jax.api import EngineConfig
from local_tier.jax.buckets import Buckets
from local_tier.jax.gguf_loader import HParams
from local_tier.jax.quant import QMAX, QuantMatrix, dequantize, qdot, quantize
from local_tier.jax.reference import reference_logits
from local_tier.jax.runner import Runner
from local_tier.jax.setup import kv_dtype_for, make_buckets
from local_tier.worker.cli import build_parser


def test_round_trip_error_is_within_half_a_step_per_column() -> None:
    rng = np.random.default_rng(0)
    # columns of very different magnitudes: a shared scale would flatten the small ones
    w = (rng.standard_normal((64, 24)) * np.geomspace(1e-3, 10, 24)).astype(np.float32)
    m = quantize(w)
    assert m.q.dtype == np.int8 and m.q.shape == (64, 24)
    assert m.scale.dtype == np.float32 and m.scale.shape == (24,)
    np.testing.assert_allclose(m.scale, np.abs(w).max(axis=0) / QMAX, rtol=1e-6)
    err = np.abs(dequantize(m) - w)
    assert np.all(err <= m.scale / 2 * (1 + 1e-5))
    assert np.all(np.abs(m.q).max(axis=0) == QMAX)  # every column uses the full range
    # relative to each column's own size, the error stays small even for the tiny columns
    rel = err.max(axis=0) / np.abs(w).max(axis=0)
    assert rel.max() <= 0.5 / QMAX + 1e-6


def test_zero_columns_get_zero_scale_and_exact_zeros() -> None:
    w = np.zeros((8, 3), np.float32)
    w[:, 1] = np.linspace(-2, 2, 8)
    m = quantize(w)
    assert m.scale[0] == 0 and m.scale[2] == 0
    assert not m.q[:, 0].any() and not m.q[:, 2].any()
    out = dequantize(m)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[:, [0, 2]], 0)
    np.testing.assert_allclose(out[:, 1], w[:, 1], atol=2 / QMAX / 2 + 1e-7)


def test_qdot_equals_x_times_the_dequantized_matrix() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((48, 40)).astype(np.float32)
    x = rng.standard_normal((3, 48)).astype(np.float32)
    m = quantize(w)
    got = np.asarray(qdot(jnp.asarray(x), QuantMatrix(jnp.asarray(m.q), jnp.asarray(m.scale))))
    x_bf16 = np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_allclose(got, x_bf16 @ dequantize(m), rtol=1e-5, atol=1e-5)


@dataclass
class TinyModel:
    hparams: HParams
    tensors: dict[str, np.ndarray]


def tiny_model(seed: int = 0) -> TinyModel:
    """A random tied Llama in GGUF naming: d_model 64, 2 layers, 4 heads over 2 KV heads."""
    hp = HParams(
        n_layers=2,
        d_model=64,
        d_ff=96,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        vocab_size=50,
        context_length=64,
        rope_base=10000.0,
        rms_eps=1e-6,
    )
    rng = np.random.default_rng(seed)

    def mat(o: int, i: int) -> np.ndarray:
        return (rng.standard_normal((o, i)) / math.sqrt(i)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    d, ff, hd = hp.d_model, hp.d_ff, hp.head_dim
    t = {"token_embd.weight": mat(hp.vocab_size, d) * 4, "output_norm.weight": norm(d)}
    for i in range(hp.n_layers):
        p = f"blk.{i}."
        t |= {
            p + "attn_norm.weight": norm(d),
            p + "ffn_norm.weight": norm(d),
            p + "attn_q.weight": mat(hp.n_heads * hd, d),
            p + "attn_k.weight": mat(hp.n_kv_heads * hd, d),
            p + "attn_v.weight": mat(hp.n_kv_heads * hd, d),
            p + "attn_output.weight": mat(d, hp.n_heads * hd) * 2,
            p + "ffn_gate.weight": mat(ff, d),
            p + "ffn_up.weight": mat(ff, d),
            p + "ffn_down.weight": mat(d, ff) * 2,
        }
    return TinyModel(hp, t)


MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def round_tripped(model: TinyModel) -> TinyModel:
    """The model with every layer matrix replaced by its int8 round trip (stored (out, in):
    the engine quantizes per output channel, i.e. per row here)."""
    t = dict(model.tensors)
    for name, w in model.tensors.items():
        if name.split(".")[-2] in MATRICES:
            t[name] = dequantize(quantize(w.T)).T
    return TinyModel(model.hparams, t)


def run_prefill(model: TinyModel, dtype: object, tokens: list[int]) -> np.ndarray:
    """Logits at the last token of ``tokens`` from the compiled step, bf16 KV cache."""
    n, bs = len(tokens), 16
    spec = M.ModelSpec(model.hparams, n_blocks=3, block_size=bs)
    k, v = M.new_cache(spec, jnp.bfloat16)
    inputs = M.StepInputs(
        tokens=np.asarray([tokens], np.int32),
        positions=np.arange(n, dtype=np.int32)[None],
        n_new=np.asarray([n], np.int32),
        ctx_blocks=np.zeros((1, 0), np.int32),
        ctx_len=np.zeros(1, np.int32),
        write_blocks=(1 + np.arange(n, dtype=np.int32) // bs)[None],
        write_offsets=(np.arange(n, dtype=np.int32) % bs)[None],
    )
    step = M.make_step(spec)
    w = M.pack_weights(model, dtype)
    logits, _, _, _ = step(w, k, v, inputs, np.asarray([n - 1], np.int32))
    out: np.ndarray = np.asarray(logits)[0]
    return out


TOKENS = [1, 7, 3, 22, 45, 9, 9, 14, 30, 2, 18, 5, 41, 33, 27, 11, 8, 49, 0, 16]


def test_int8_step_matches_the_reference_on_round_tripped_weights() -> None:
    """The int8 step computes the model whose matrices are ``q * scale``: against the float64
    reference on those weights it differs only by bf16 rounding (activations, embedding, KV),
    like the bf16 step against the reference on the original weights."""
    model = tiny_model(seed=3)
    got = run_prefill(model, jnp.int8, TOKENS)
    want = reference_logits(round_tripped(model), TOKENS)[-1]
    bf16 = run_prefill(model, jnp.bfloat16, TOKENS)
    bf16_err = np.abs(bf16 - reference_logits(model, TOKENS)[-1]).max()
    assert np.abs(want).max() > 2.0  # the check is not vacuous
    assert np.abs(got - want).max() <= max(2 * bf16_err, 0.05)


def test_int8_step_stays_close_to_the_float_model() -> None:
    model = tiny_model(seed=4)
    got = run_prefill(model, jnp.int8, TOKENS)
    want = reference_logits(model, TOKENS)[-1]
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel < 0.03
    assert np.argmax(got) == np.argmax(want)


def test_packed_layout_quantizes_layer_matrices_and_keeps_the_rest() -> None:
    model = tiny_model()
    w = M.pack_weights(model, jnp.int8)
    hp = model.hparams
    layer = w.layers[0]
    shapes = {
        "w_qkv": (hp.d_model, (hp.n_heads + 2 * hp.n_kv_heads) * hp.head_dim),
        "w_o": (hp.n_heads * hp.head_dim, hp.d_model),
        "w_gu": (hp.d_model, 2 * hp.d_ff),
        "w_down": (hp.d_ff, hp.d_model),
    }
    for name, shape in shapes.items():
        m = getattr(layer, name)
        assert isinstance(m, QuantMatrix), name
        assert m.q.dtype == np.int8 and m.q.shape == shape
        assert m.scale.dtype == np.float32 and m.scale.shape == (shape[1],)
    assert layer.attn_norm.dtype == np.float32 and w.out_norm.dtype == np.float32
    assert w.emb_t.dtype == jnp.bfloat16 and w.emb_in is None
    # the fp32 path is untouched: plain arrays
    assert M.pack_weights(model, jnp.float32).layers[0].w_qkv.dtype == np.float32


def test_decode_weight_bytes_count_int8_and_scales() -> None:
    model = tiny_model()
    hp = model.hparams
    spec = M.ModelSpec(hp, n_blocks=3, block_size=16)
    buckets = Buckets.build(2, 64, 32, 1, 16)
    dev = jax.devices("cpu")[0]
    i8 = Runner(spec, M.pack_weights(model, jnp.int8), jnp.bfloat16, buckets, dev)
    bf = Runner(spec, M.pack_weights(model, jnp.bfloat16), jnp.bfloat16, buckets, dev)
    d, hd = hp.d_model, hp.head_dim
    per_layer = [(d, (hp.n_heads + 2 * hp.n_kv_heads) * hd), (hp.n_heads * hd, d)]
    per_layer += [(d, 2 * hp.d_ff), (hp.d_ff, d)]
    mat_elems = hp.n_layers * sum(i * o for i, o in per_layer)
    scales = hp.n_layers * sum(o for _, o in per_layer)
    rest = 2 * d * hp.vocab_size + 4 * (d + 2 * hp.n_layers * d + hd // 2)  # bf16 emb, fp32
    assert i8.decode_weight_bytes == mat_elems + 4 * scales + rest
    assert bf.decode_weight_bytes == 2 * mat_elems + rest


def test_int8_config_choices() -> None:
    assert msgspec.convert({"dtype": "int8"}, EngineConfig).dtype == "int8"
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"dtype": "int4"}, EngineConfig)
    provider = msgspec.convert({"type": "jax", "dtype": "int8"}, JaxProviderConfig)
    assert provider.dtype == "int8"
    assert build_parser().parse_args(["--dtype", "int8"]).dtype == "int8"
    # int8 weights keep a bf16 KV cache and, multiplying in bf16, the CPU's two-row minimum
    assert kv_dtype_for("int8") == "bfloat16" and kv_dtype_for("float32") == "float32"
    buckets = make_buckets(EngineConfig(dtype="int8", max_batch_size=8), 256, "cpu")
    assert min(buckets.decode_batch) == 2
