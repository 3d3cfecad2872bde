"""Hugging Face model folders for the JAX engine: config parsing per architecture, clear
errors, RoPE scaling against transformers' rule, the tokenizer files, and one tiny folder run
through the JAX step against the NumPy reference (no torch needed; the comparison with
transformers itself is tests/integration/test_jax_hf_models.py, slow stage)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file
from tokenizers import AddedToken, models, pre_tokenizers
from tokenizers import Tokenizer as FastTokenizer

from local_tier.jax.gguf_loader import ModelLoadError, RopeScaling
from local_tier.jax.hf_loader import load_hf, parse_config, permute_qk
from local_tier.jax.hf_tokenizer import HFTokenizer
from local_tier.jax.rope import inv_frequencies
from local_tier.jax.setup import max_model_len

HERE = Path("config-dir")

# Excerpts of real config.json files (transformers 4 style, as published).
LLAMA_3_1_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "hidden_act": "silu",
    "mlp_bias": False,
    "attention_bias": False,
    "tie_word_embeddings": False,
}
MISTRAL_7B_V01: dict[str, Any] = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "hidden_act": "silu",
}
QWEN2_5_0_5B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "use_sliding_window": False,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
}


def test_llama_3_1_config() -> None:
    hp = parse_config(LLAMA_3_1_8B, HERE)
    assert (hp.n_layers, hp.d_model, hp.d_ff) == (32, 4096, 14336)
    assert (hp.n_heads, hp.n_kv_heads, hp.head_dim) == (32, 8, 128)
    assert (hp.vocab_size, hp.context_length, hp.rope_base) == (128256, 131072, 500000.0)
    assert hp.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    assert hp.sliding_window is None and hp.rms_eps == 1e-05


def test_transformers_5_rope_parameters_are_read_like_rope_scaling() -> None:
    cfg = {k: v for k, v in LLAMA_3_1_8B.items() if k not in ("rope_theta", "rope_scaling")}
    cfg["rope_parameters"] = {**LLAMA_3_1_8B["rope_scaling"], "rope_theta": 500000.0}
    assert parse_config(cfg, HERE) == parse_config(LLAMA_3_1_8B, HERE)
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 100000.0}
    hp = parse_config(cfg, HERE)
    assert hp.rope_scaling is None and hp.rope_base == 100000.0


def test_mistral_config_keeps_its_window_and_explicit_head_dim() -> None:
    hp = parse_config({**MISTRAL_7B_V01, "head_dim": 160}, HERE)
    assert hp.sliding_window == 4096 and hp.head_dim == 160 and hp.n_kv_heads == 8
    assert parse_config({**MISTRAL_7B_V01, "sliding_window": None}, HERE).sliding_window is None


def test_qwen2_window_only_with_use_sliding_window() -> None:
    assert parse_config(QWEN2_5_0_5B, HERE).sliding_window is None
    on = {**QWEN2_5_0_5B, "use_sliding_window": True, "sliding_window": 4096}
    assert parse_config(on, HERE).sliding_window == 4096  # layers 21.. of 24 use it
    assert parse_config({**on, "max_window_layers": 24}, HERE).sliding_window is None
    full = {**on, "layer_types": ["full_attention"] * 24}
    assert parse_config(full, HERE).sliding_window is None


def test_max_model_len_is_capped_by_context_and_window() -> None:
    from local_tier.jax.api import EngineConfig

    notes: list[str] = []
    mistral = parse_config(MISTRAL_7B_V01, HERE)
    assert max_model_len(EngineConfig(max_model_len=8192), mistral, notes.append) == 4096
    assert "sliding window 4096" in notes[0]
    assert max_model_len(EngineConfig(max_model_len=2048), mistral, notes.append) == 2048
    qwen = parse_config({**QWEN2_5_0_5B, "max_position_embeddings": 1024}, HERE)
    assert max_model_len(EngineConfig(max_model_len=2048), qwen, notes.append) == 1024
    assert len(notes) == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, r"GPT2LMHeadModel; supported: Llama"),
        ({"hidden_act": "gelu"}, r"unsupported hidden_act 'gelu'"),
        ({"mlp_bias": True}, r"unsupported mlp_bias"),
        ({"quantization_config": {"quant_method": "gptq"}}, r"quantization_config"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"RoPE scaling 'yarn'"),
        ({"rope_scaling": {"type": "llama3", "factor": 8.0}}, r"lacks 'low_freq_factor'"),
        ({"hidden_size": None}, r"lacks a positive integer 'hidden_size'"),
    ],
)
def test_unsupported_configs_are_named(change: dict[str, Any], message: str) -> None:
    from local_tier.jax.hf_loader import architecture_of

    cfg = {**LLAMA_3_1_8B, **change}
    with pytest.raises(ModelLoadError, match=message):
        architecture_of(cfg, HERE)
        parse_config(cfg, HERE)


def transformers_llama3_inv_freq(
    base: float, dim: int, factor: float, low: float, high: float, old_len: int
) -> np.ndarray:
    """transformers' ``_compute_llama3_parameters`` transcribed to NumPy (float32 like torch)."""
    inv_freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return np.where(is_medium, smoothed, inv_freq_llama).astype(np.float32)


@pytest.mark.parametrize(("head_dim", "old_len"), [(128, 8192), (64, 8192), (16, 64)])
def test_llama3_frequencies_follow_transformers(head_dim: int, old_len: int) -> None:
    scaling = RopeScaling("llama3", 8.0, 1.0, 4.0, old_len)
    hp = replace(parse_config(LLAMA_3_1_8B, HERE), head_dim=head_dim, rope_scaling=scaling)
    got = inv_frequencies(hp)
    want = transformers_llama3_inv_freq(500000.0, head_dim, 8.0, 1.0, 4.0, old_len)
    np.testing.assert_allclose(got, want, rtol=2e-6)
    plain = inv_frequencies(replace(hp, rope_scaling=None))
    kept, divided = got == plain, np.isclose(got, plain / 8.0, rtol=1e-6)
    assert kept.any() and divided.any() and (~kept & ~divided).any()  # all three regimes


def test_linear_scaling_divides_every_frequency() -> None:
    hp = parse_config({**LLAMA_3_1_8B, "rope_scaling": {"type": "linear", "factor": 4.0}}, HERE)
    plain = inv_frequencies(replace(hp, rope_scaling=None))
    np.testing.assert_allclose(inv_frequencies(hp), plain / 4.0, rtol=1e-6)


# ---------------------------------------------------------------- a tiny folder on disk

VOCAB = ["<unk>", "<|im_start|>", "<|im_end|>", "hello", "world", "the", "sky", "is", "blue"]
VOCAB += [f"w{i}" for i in range(32 - len(VOCAB))]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'skip' %}{% continue %}{% endif %}"
    "{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def tiny_config(**change: Any) -> dict[str, Any]:
    cfg = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": len(VOCAB),
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        "tie_word_embeddings": False,
        "eos_token_id": 2,
    }
    return {**cfg, **change}


def tiny_tensors(cfg: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights in Hugging Face names (Q/K/V biases as Qwen2 has)."""
    rng = np.random.default_rng(seed)
    d, ff, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = d // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def mat(o: int, i: int) -> np.ndarray:
        return (rng.standard_normal((o, i)) / math.sqrt(i)).astype(np.float32)

    def vec(n: int, mean: float, std: float) -> np.ndarray:
        return (mean + std * rng.standard_normal(n)).astype(np.float32)

    t = {
        "model.embed_tokens.weight": mat(v, d) * 0.5 * math.sqrt(d),
        "model.norm.weight": vec(d, 1, 0.2),
    }
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = mat(v, d) * 3
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t |= {
            p + "input_layernorm.weight": vec(d, 1, 0.2),
            p + "post_attention_layernorm.weight": vec(d, 1, 0.2),
            p + "self_attn.q_proj.weight": mat(q, d),
            p + "self_attn.k_proj.weight": mat(kv, d),
            p + "self_attn.v_proj.weight": mat(kv, d),
            p + "self_attn.q_proj.bias": vec(q, 0, 0.5),
            p + "self_attn.k_proj.bias": vec(kv, 0, 0.5),
            p + "self_attn.v_proj.bias": vec(kv, 0, 0.5),
            p + "self_attn.o_proj.weight": mat(d, q) * 3,
            p + "mlp.gate_proj.weight": mat(ff, d),
            p + "mlp.up_proj.weight": mat(ff, d),
            p + "mlp.down_proj.weight": mat(d, ff) * 3,
        }
    return t


def tokenizer_json() -> str:
    tok = FastTokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True) for t in VOCAB[1:3]])
    return str(tok.to_str())


def write_folder(folder: Path, cfg: dict[str, Any], tensors: dict[str, np.ndarray]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "tokenizer.json").write_text(tokenizer_json())
    tok_config = {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    return folder


def test_tiny_folder_loads_in_engine_layout(tmp_path: Path) -> None:
    cfg = tiny_config()
    tensors = tiny_tensors(cfg)
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(4, np.float32)  # ignored
    model = load_hf(write_folder(tmp_path / "tiny", cfg, tensors))
    assert model.architecture == "qwen2" and model.name == "tiny"
    t = model.tensors
    assert "blk.0.self_attn.rotary_emb" not in str(sorted(t))
    np.testing.assert_array_equal(t["token_embd.weight"], tensors["model.embed_tokens.weight"])
    np.testing.assert_array_equal(t["output.weight"], tensors["lm_head.weight"])
    np.testing.assert_array_equal(
        t["blk.1.ffn_down.weight"], tensors["model.layers.1.mlp.down_proj.weight"]
    )
    # Q/K rows: head h's split halves [x0..x3 | y0..y3] interleave to x0 y0 x1 y1 ...
    q = tensors["model.layers.0.self_attn.q_proj.weight"]
    np.testing.assert_array_equal(t["blk.0.attn_q.weight"][:8:2], q[:4])
    np.testing.assert_array_equal(t["blk.0.attn_q.weight"][1:8:2], q[4:8])
    kb = tensors["model.layers.0.self_attn.k_proj.bias"]
    np.testing.assert_array_equal(t["blk.0.attn_k.bias"], permute_qk(kb, 2))
    np.testing.assert_array_equal(
        t["blk.0.attn_v.bias"], tensors["model.layers.0.self_attn.v_proj.bias"]
    )


def test_tied_bf16_folder_reads_exact_values(tmp_path: Path) -> None:
    cfg = tiny_config(tie_word_embeddings=True)
    tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in tiny_tensors(cfg).items()}
    tensors["lm_head.weight"] = np.zeros((len(VOCAB), 32), ml_dtypes.bfloat16)  # tied: unused
    model = load_hf(write_folder(tmp_path / "tied", cfg, tensors))
    assert "output.weight" not in model.tensors
    emb = model.tensors["token_embd.weight"]
    assert emb.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(
        emb.astype(np.float32), tensors["model.embed_tokens.weight"].astype(np.float32)
    )


def test_sharded_folder_reads_every_shard(tmp_path: Path) -> None:
    cfg = tiny_config()
    tensors = tiny_tensors(cfg)
    folder = write_folder(tmp_path / "sharded", cfg, {})
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[:5],
        "model-00002-of-00002.safetensors": names[5:],
    }
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(folder / file))
    weight_map = {k: f for f, keys in shards.items() for k in keys}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    model = load_hf(folder)
    assert len(model.tensors) == len(tensors)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="lacks shards: model-00002-of-00002"):
        load_hf(folder)


def test_missing_files_and_tensors_are_clear_errors(tmp_path: Path) -> None:
    cfg = tiny_config()
    with pytest.raises(ModelLoadError, match="Model folder not found"):
        load_hf(tmp_path / "nowhere")
    folder = write_folder(tmp_path / "m", cfg, tiny_tensors(cfg))
    (folder / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"has no config\.json"):
        load_hf(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"config\.json is not valid JSON"):
        load_hf(folder)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match=r"no tokenizer\.json"):
        load_hf(folder)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match=r"found pytorch_model.bin: only safetensors"):
        load_hf(folder)
    (folder / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(ModelLoadError, match="not a valid safetensors file"):
        load_hf(folder)


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        ("lm_head.weight", "lacks lm_head.weight and tie_word_embeddings is not true"),
        ("model.layers.1.self_attn.q_proj.bias", r"lacks tensors \(GGUF names\): blk.1.attn_q"),
        ("model.layers.0.mlp.up_proj.weight", r"blk.0.ffn_up.weight"),
    ],
)
def test_missing_tensor_is_named(tmp_path: Path, drop: str, message: str) -> None:
    cfg = tiny_config()
    tensors = tiny_tensors(cfg)
    del tensors[drop]
    with pytest.raises(ModelLoadError, match=message):
        load_hf(write_folder(tmp_path / "m", cfg, tensors))


def test_wrong_shape_is_named(tmp_path: Path) -> None:
    cfg = tiny_config(num_key_value_heads=4)  # the tensors have 2 KV heads
    with pytest.raises(ModelLoadError, match=r"blk.0.attn_k.weight has shape \(16, 32\)"):
        load_hf(write_folder(tmp_path / "m", cfg, tiny_tensors(tiny_config())))


def test_tokenizer_files(tmp_path: Path) -> None:
    cfg = tiny_config()
    tok = HFTokenizer(load_hf(write_folder(tmp_path / "m", cfg, tiny_tensors(cfg))).tokenizer)
    assert tok.eos_token_ids == (0, 2)  # generation_config's list; eos_token's id is in it
    assert tok.encode("<|im_start|>hello sky") == [1, 3, 6]
    assert tok.decode([1, 3, 6]) == "hello sky"
    msgs = [{"role": "user", "content": "hi"}, {"role": "skip", "content": "x"}]
    assert tok.apply_chat_template(msgs) == "<|im_start|>user: hi<|im_end|>assistant:"
    assert tok.vocab_size == len(VOCAB)


def test_tiny_folder_runs_in_the_jax_step_like_the_reference(tmp_path: Path) -> None:
    """Biases, untied embeddings and llama3 RoPE through ``model.py``'s compiled step (paged
    cache, split-half RoPE on un-permuted weights) against ``reference.py``."""
    import jax.numpy as jnp

    from local_tier.jax import model as M
    from local_tier.jax.reference import reference_logits

    cfg = tiny_config()
    model = load_hf(write_folder(tmp_path / "m", cfg, tiny_tensors(cfg, seed=3)))
    tokens = [1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
    n, bs = len(tokens), 16
    spec = M.ModelSpec(model.hparams, n_blocks=3, block_size=bs)
    k, v = M.new_cache(spec, jnp.float32)
    step = M.make_step(spec)
    w = M.pack_weights(model, jnp.float32)
    zeros = np.zeros((1, 0), np.int32)
    inputs = M.StepInputs(
        tokens=np.asarray([tokens], np.int32),
        positions=np.arange(n, dtype=np.int32)[None],
        n_new=np.asarray([n], np.int32),
        ctx_blocks=zeros,
        ctx_len=np.zeros(1, np.int32),
        write_blocks=(1 + np.arange(n, dtype=np.int32) // bs)[None],
        write_offsets=(np.arange(n, dtype=np.int32) % bs)[None],
    )
    logits, _, _, _ = step(w, k, v, inputs, np.asarray([n - 1], np.int32))
    want = reference_logits(model, tokens)[-1]
    assert np.abs(want).max() > 1.0  # the check is not vacuous
    np.testing.assert_allclose(np.asarray(logits)[0], want, atol=2e-4, rtol=0)
