"""Read a Hugging Face model folder into the shape the engine consumes (like a GGUF model).

A folder holds ``config.json``, the weights as ``model.safetensors`` or as shards listed in
``model.safetensors.index.json``, and the tokenizer files (``hf_tokenizer.py``). Supported
architectures: ``LlamaForCausalLM`` (with ``rope_scaling`` of type ``linear`` or ``llama3``,
optional ``attention_bias``), ``MistralForCausalLM`` (its ``sliding_window`` is reported in
``HParams``; the engine caps ``max_model_len`` to it) and ``Qwen2ForCausalLM`` (Q/K/V biases;
tied or untied embeddings by ``tie_word_embeddings``).

The tensors come back under GGUF names (``blk.0.attn_q.weight``, ``token_embd.weight``, ...)
in ``(out_features, in_features)`` order and in their stored dtype (float32, float16 or
bfloat16), with the Q and K rows (and biases) permuted the way llama.cpp's converter does.
That is the order ``model.pack_weights`` un-permutes and ``reference.py`` uses as is, so one
model code serves both formats.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from local_tier.jax.gguf_loader import HParams, ModelLoadError, RopeScaling
from local_tier.jax.hf_tokenizer import HFTokenizerData, read_json, read_tokenizer_files

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")


@dataclass
class HFModel:
    """Everything the engine needs from one Hugging Face folder (cf. ``GGUFModel``)."""

    path: Path
    name: str
    architecture: str  # "llama" | "mistral" | "qwen2"
    hparams: HParams
    tensors: dict[str, np.ndarray]
    tokenizer: HFTokenizerData
    config: dict[str, Any] = field(default_factory=dict)


def is_hf_folder(path: str | Path) -> bool:
    """Whether ``model_path`` names a folder (a Hugging Face model) rather than a file."""
    return Path(path).is_dir()


def load_hf(path: str | Path) -> HFModel:
    """Read config, weights and tokenizer of a folder; ``ModelLoadError`` says what is wrong."""
    folder = Path(path)
    if not folder.is_dir():
        raise ModelLoadError(f"Model folder not found: {folder} (check model_path).")
    config = read_json(folder / "config.json")
    arch = architecture_of(config, folder)
    hp = parse_config(config, folder)
    biases = needs_bias(arch, config)
    tensors = to_engine_layout(read_tensors(folder), hp, config, biases, folder)
    check_tensors(tensors, hp, biases, folder)
    tok = read_tokenizer_files(folder, config)
    return HFModel(folder, folder.name, arch, hp, tensors, tok, config)


def architecture_of(config: dict[str, Any], where: Path) -> str:
    """``llama``/``mistral``/``qwen2`` from ``architectures`` (else ``model_type``)."""
    names = config.get("architectures") or []
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    model_type = config.get("model_type")
    if not names and model_type in ARCHITECTURES.values():
        return str(model_type)
    found = ", ".join(map(str, names)) or f"model_type {model_type!r}"
    raise ModelLoadError(
        f"Model folder {where} has architecture {found}; supported: {', '.join(ARCHITECTURES)}."
    )


def parse_config(config: dict[str, Any], where: Path) -> HParams:
    """``HParams`` from a config.json; ``ModelLoadError`` for a missing key or a feature the
    engine lacks (another activation, MLP biases, partial or unsupported RoPE scaling)."""

    def need(key: str) -> int:
        value = config.get(key)
        if not isinstance(value, int) or value < 1:
            raise ModelLoadError(f"{where / 'config.json'} lacks a positive integer {key!r}.")
        return value

    _check_supported(config, where)
    d_model, n_heads = need("hidden_size"), need("num_attention_heads")
    n_layers = need("num_hidden_layers")
    theta, scaling = _rope(config, where)
    return HParams(
        n_layers=n_layers,
        d_model=d_model,
        d_ff=need("intermediate_size"),
        n_heads=n_heads,
        n_kv_heads=int(config.get("num_key_value_heads") or n_heads),
        head_dim=int(config.get("head_dim") or d_model // n_heads),
        vocab_size=need("vocab_size"),
        context_length=int(config.get("max_position_embeddings") or 2048),
        rope_base=theta,
        rms_eps=float(config.get("rms_norm_eps") or 1e-6),
        rope_scaling=scaling,
        sliding_window=sliding_window(config, n_layers),
    )


def _check_supported(config: dict[str, Any], where: Path) -> None:
    act = config.get("hidden_act", "silu")
    problems = []
    if act != "silu":
        problems.append(f"hidden_act {act!r} (only 'silu')")
    if config.get("mlp_bias"):
        problems.append("mlp_bias")
    if config.get("quantization_config"):
        problems.append("a quantization_config (only float32/float16/bfloat16 weights)")
    if problems:
        raise ModelLoadError(f"{where / 'config.json'}: unsupported {', '.join(problems)}.")


def _rope(config: dict[str, Any], where: Path) -> tuple[float, RopeScaling | None]:
    """RoPE base and scaling from ``rope_theta``/``rope_scaling`` (transformers 4) or
    ``rope_parameters`` (transformers 5)."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or params
    theta = config.get("rope_theta") or params.get("rope_theta") or 10000.0
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if float(scaling.get("partial_rotary_factor") or 1.0) != 1.0:
        raise ModelLoadError(f"{where / 'config.json'}: partial_rotary_factor is unsupported.")
    try:
        if kind == "default":
            return float(theta), None
        if kind == "linear":
            return float(theta), RopeScaling("linear", float(scaling["factor"]))
        if kind == "llama3":
            return float(theta), RopeScaling(
                "llama3",
                float(scaling["factor"]),
                float(scaling["low_freq_factor"]),
                float(scaling["high_freq_factor"]),
                int(scaling["original_max_position_embeddings"]),
            )
    except KeyError as exc:
        raise ModelLoadError(
            f"{where / 'config.json'}: RoPE scaling {kind!r} lacks {exc.args[0]!r}."
        ) from exc
    raise ModelLoadError(
        f"{where / 'config.json'}: RoPE scaling {kind!r} is unsupported "
        f"(supported: default, linear, llama3)."
    )


def sliding_window(config: dict[str, Any], n_layers: int) -> int | None:
    """The attention window if any layer uses one (Mistral's ``sliding_window``; Qwen2's only
    with ``use_sliding_window``, for layers from ``max_window_layers`` on), else None."""
    window = config.get("sliding_window")
    if not isinstance(window, int) or window < 1:
        return None
    if config.get("model_type") == "qwen2" or "use_sliding_window" in config:
        if not config.get("use_sliding_window"):
            return None
        types = config.get("layer_types")
        if isinstance(types, list):
            return window if "sliding_attention" in types else None
        first = config.get("max_window_layers")
        return window if first is None or int(first) < n_layers else None
    return window


def needs_bias(arch: str, config: dict[str, Any]) -> tuple[str, ...]:
    """The attention projections that must have a bias: Qwen2's Q/K/V, all four for a Llama
    with ``attention_bias``."""
    if arch == "qwen2":
        return ("attn_q", "attn_k", "attn_v")
    if config.get("attention_bias"):
        return ("attn_q", "attn_k", "attn_v", "attn_output")
    return ()


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files: ``model.safetensors``, else the index's shards (all present)."""
    single = folder / SINGLE_FILE
    if single.is_file():
        return [single]
    index = folder / INDEX_FILE
    if not index.is_file():
        other = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
        hint = (
            f" (found {', '.join(sorted(other))}: only safetensors is supported)" if other else ""
        )
        raise ModelLoadError(f"Model folder {folder} has no {SINGLE_FILE} or {INDEX_FILE}{hint}.")
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(f"{index} has no weight_map.")
    shards = [folder / str(name) for name in sorted(set(weight_map.values()))]
    missing = [p.name for p in shards if not p.is_file()]
    if missing:
        raise ModelLoadError(f"Model folder {folder} lacks shards: {', '.join(missing)}.")
    return shards


def read_tensors(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder's safetensors files, in its stored dtype."""
    import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy, so BF16 tensors load)
    from safetensors import safe_open

    out: dict[str, np.ndarray] = {}
    for path in weight_files(folder):
        try:
            with safe_open(str(path), framework="np") as f:
                for key in f.keys():  # noqa: SIM118  (a safetensors handle, not a dict)
                    out[key] = f.get_tensor(key)
        except Exception as exc:  # the reader's errors are of several Rust-side types
            raise ModelLoadError(
                f"{path} is not a valid safetensors file ({type(exc).__name__}: {exc})."
            ) from exc
    return out


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter permutation of Q/K rows (out, ...) or a bias (out,): Hugging
    Face's split-half order -> the interleaved order GGUF files store."""
    hd = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def to_engine_layout(
    tensors: dict[str, np.ndarray],
    hp: HParams,
    config: dict[str, Any],
    biases: tuple[str, ...],
    where: Path,
) -> dict[str, np.ndarray]:
    """Rename to GGUF names, permute Q/K, drop a tied ``lm_head``. What transformers would not
    use either is dropped: biases the architecture has none of, and names the engine does not
    know (such as old checkpoints' ``rotary_emb.inv_freq``)."""
    out: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        new = _gguf_name(name)
        if new is None or (new.endswith(".bias") and new.split(".")[2] not in biases):
            continue
        if value.dtype.name not in FLOAT_DTYPES:
            raise ModelLoadError(f"Model folder {where}: tensor {name} is {value.dtype}.")
        part = new.split(".")[-2]
        heads = {"attn_q": hp.n_heads, "attn_k": hp.n_kv_heads}.get(part)
        out[new] = value if heads is None else permute_qk(value, heads)
    if config.get("tie_word_embeddings", False):
        out.pop("output.weight", None)
    elif "output.weight" not in out:
        raise ModelLoadError(
            f"Model folder {where} lacks lm_head.weight and tie_word_embeddings is not true."
        )
    return out


def _gguf_name(name: str) -> str | None:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    m = _LAYER_RE.fullmatch(name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        return None
    return f"blk.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"


def expected_shapes(hp: HParams, biases: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """GGUF name -> shape of every tensor the model needs (``output.weight`` is optional)."""
    d, q, kv, ff = hp.d_model, hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim, hp.d_ff
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (hp.vocab_size, d),
        "output_norm.weight": (d,),
    }
    layer = {
        "attn_norm": (d,),
        "ffn_norm": (d,),
        "attn_q": (q, d),
        "attn_k": (kv, d),
        "attn_v": (kv, d),
        "attn_output": (d, q),
        "ffn_gate": (ff, d),
        "ffn_up": (ff, d),
        "ffn_down": (d, ff),
    }
    for i in range(hp.n_layers):
        shapes.update({f"blk.{i}.{n}.weight": s for n, s in layer.items()})
        shapes.update({f"blk.{i}.{n}.bias": (layer[n][0],) for n in biases})
    return shapes


def check_tensors(
    tensors: dict[str, np.ndarray], hp: HParams, biases: tuple[str, ...], where: Path
) -> None:
    """``ModelLoadError`` naming missing tensors or the first one of the wrong shape."""
    shapes = expected_shapes(hp, biases)
    if "output.weight" in tensors:
        shapes["output.weight"] = (hp.vocab_size, hp.d_model)
    missing = [n for n in shapes if n not in tensors]
    if missing:
        raise ModelLoadError(
            f"Model folder {where} lacks tensors (GGUF names): {', '.join(missing[:5])}."
        )
    for name, shape in shapes.items():
        if tuple(tensors[name].shape) != shape:
            raise ModelLoadError(
                f"Model folder {where}: tensor {name} has shape {tuple(tensors[name].shape)}, "
                f"config.json implies {shape}."
            )
