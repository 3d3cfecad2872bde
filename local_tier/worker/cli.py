"""``python -m local_tier.worker`` (and ``switchyard worker jax``): one JAX engine behind
vLLM's HTTP API. Flags follow ``vllm serve`` where vLLM has the same knob."""

from __future__ import annotations

import argparse
import logging
from typing import Any

import msgspec
import uvicorn

from core.config import JaxProviderConfig
from local_tier.jax.api import EngineProtocol
from local_tier.provider import open_engine
from local_tier.worker.app import create_app
from local_tier.worker.state import WorkerState

log = logging.getLogger("switchyard.worker")
_DEFAULTS = JaxProviderConfig()
# A worker process is a dedicated model server, so its defaults follow ``vllm serve`` rather
# than the embedded provider's: the model's serving dtype (bf16 weights and KV cache; prefill
# keeps fp32 weights on CPUs without bf16 instructions, see local_tier/jax/setup.py) and a
# batch wide enough for 32 concurrent streams. On a 2-core CPU, bf16 decode steps take
# 0.5-0.65x the fp32 time at 2-32 rows (half the bytes read), and a batch capped at 8 left
# 32 streams decoding 8 at a time.
WORKER_DTYPE = "bfloat16"
WORKER_MAX_BATCH = 32


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="switchyard worker jax", description=__doc__)
    p.add_argument(
        "--model",
        default=None,
        help="GGUF file or Hugging Face model folder (default: bundled SmolLM2-135M)",
    )
    p.add_argument("--served-model-name", default=_DEFAULTS.served_model_name)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "int8"], default=WORKER_DTYPE)
    p.add_argument("--backend", choices=["auto", "cpu", "gpu", "tpu"], default=_DEFAULTS.backend)
    p.add_argument(
        "--tensor-parallel-size",
        "--tensor-parallel",
        "-tp",
        type=int,
        default=_DEFAULTS.tensor_parallel,
        dest="tensor_parallel",
        help="devices the model is split over (must divide its KV heads)",
    )
    p.add_argument(
        "--data-parallel-size",
        "--data-parallel",
        "-dp",
        type=int,
        default=_DEFAULTS.data_parallel,
        dest="data_parallel",
        help="model replicas in this process, each on its own tensor-parallel devices",
    )
    p.add_argument(
        "--max-batch-size",
        "--max-num-seqs",
        type=int,
        default=WORKER_MAX_BATCH,
        dest="max_batch_size",
    )
    p.add_argument("--max-model-len", type=int, default=_DEFAULTS.max_model_len)
    p.add_argument("--kv-cache-tokens", type=int, default=_DEFAULTS.kv_cache_tokens)
    p.add_argument(
        "--gpu-memory-utilization",
        "--kv-cache-fraction",
        type=float,
        default=None,
        dest="kv_cache_fraction",
        help="share of the device's memory for the model; the KV cache gets what is left "
        "(replaces --kv-cache-tokens)",
    )
    p.add_argument("--attention", choices=["auto", "xla", "pallas"], default="auto")
    p.add_argument("--block-size", type=int, default=_DEFAULTS.block_size)
    p.add_argument("--compile-cache-dir", default=None)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def config_from_args(args: argparse.Namespace) -> JaxProviderConfig:
    """The provider config the flags describe, validated like the policy file's."""
    fields: dict[str, Any] = {
        "type": "jax",
        "model_path": args.model,
        "served_model_name": args.served_model_name,
        "dtype": args.dtype,
        "backend": args.backend,
        "tensor_parallel": args.tensor_parallel,
        "data_parallel": args.data_parallel,
        "max_batch_size": args.max_batch_size,
        "max_model_len": args.max_model_len,
        "kv_cache_tokens": args.kv_cache_tokens,
        "kv_cache_fraction": args.kv_cache_fraction,
        "attention": args.attention,
        "block_size": args.block_size,
        "compile_cache_dir": args.compile_cache_dir,
    }
    return msgspec.convert(fields, JaxProviderConfig)


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGINT/SIGTERM; returns 1 when the model could not be loaded, else 0
    (after a signal, uvicorn re-raises it once the app has shut down gracefully)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except msgspec.ValidationError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    failures: list[BaseException] = []
    server: uvicorn.Server | None = None

    def fatal(exc: BaseException) -> None:
        failures.append(exc)
        if server is not None:
            server.should_exit = True

    async def load(cfg: JaxProviderConfig) -> EngineProtocol:
        return await open_engine(cfg, log.info)

    app = create_app(WorkerState(config, load, on_fatal=fatal))
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            lifespan="on",
            timeout_graceful_shutdown=5,
        )
    )
    server.run()
    return 1 if failures else 0
