"""Turns a ``StepPlan`` into padded device inputs, runs the compiled step, returns logits.

Owns the device state: weights and the two KV cache arrays (donated to every step, so XLA
updates them in place). ``prepare`` (host, cheap) and ``execute`` (device) are separate so the
engine can run ``execute`` in a worker thread while its event loop stays responsive.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from local_tier.jax import model as M
from local_tier.jax import sharding
from local_tier.jax.buckets import Buckets
from local_tier.jax.compile_plan import Shape, decode_need, prefill_need, serving_shape
from local_tier.jax.device_sampling import END_WIDTH, RowState, SamplingArrays, build_arrays
from local_tier.jax.scheduler import Sequence, StepPlan

I32 = np.int32


@dataclass
class Batch:
    """Host arrays for one step, and its rows' sampling arrays."""

    inputs: M.StepInputs
    logit_index: np.ndarray
    rows: int  # real rows (the rest is padding)
    sampling: SamplingArrays | None = None  # None: every row greedy (warm-up, tests)
    kept: np.ndarray | None = None  # (B,) bool: rows whose token counts (sampled rows)


@dataclass
class Pending:
    """A dispatched step: its device outputs, not yet read back."""

    top: Any  # (B,) int32 device array: each row's next token
    logits: Any | None  # (B, vocab) device array, when the host needs them
    rows: int
    sampling: Any  # the rows' SamplingArrays advanced past ``top`` (device)


class Runner:
    """Device weights + KV cache + the compiled step.

    ``prefill_weights`` (optional) serve prefill steps: on a CPU without native bf16, XLA's
    bf16 matmuls are 1.5x faster than fp32 for few-row decode (half the bytes) but 1.5x slower
    for many-row prefill (conversion-bound), so the default there keeps an fp32 copy for
    prefill. Where the CPU has bf16 instructions (AVX512-BF16), bf16 prefill is the faster one
    (1.1-1.55x) and no copy is kept.
    """

    def __init__(
        self,
        spec: M.ModelSpec,
        weights: M.Weights,
        kv_dtype: Any,
        buckets: Buckets,
        device: Any,
        prefill_weights: M.Weights | None = None,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.spec = spec
        self.block_size = spec.block_size
        self.buckets = buckets
        # ``device``: a JAX device, or a ``sharding.Placement`` (a tensor-parallel mesh whose
        # weights were packed with ``pack_weights(..., tp)``); arrays are placed accordingly.
        self.placement = sharding.as_placement(device)
        if self.placement.tp != spec.tp:
            raise ValueError(f"ModelSpec.tp={spec.tp} but {self.placement.tp} devices given")
        self.device = self.placement.device
        place = self.placement.put_weights
        self.weights = place(weights)
        self.prefill_weights = self.weights if prefill_weights is None else place(prefill_weights)
        self.k_cache, self.v_cache = M.new_cache(spec, kv_dtype, self.placement.cache)
        # XLA:GPU runs a conditional by copying its predicate to the host, which would
        # stall the step dispatched ahead; elsewhere conditionals skip unneeded sampling work.
        branches = self.device.platform not in ("gpu", "cuda")
        self._jit_step = M.make_sampling_step(spec, branches)
        self.vocab = int(weights.emb_t.shape[1])
        self._step = self._call_step  # every step runs through here (see ``_call_step``)
        self._compiled: dict[Shape, Any] = {}  # ahead-of-time executables (``compile_shape``)
        self._serve_memo: dict[Shape, Shape] = {}  # bucket shape -> shape that runs it
        self._abstract: tuple[Any, Any, Any, Any] | None = None  # see ``_abstract_args``
        self.serving_compiles: list[Shape] = []  # shapes compiled by a step (stalls)
        # Told of a plan's own shape while it runs padded to a larger one (once per compile
        # state): ``Engine.start`` points it at the background compiler's ``prefer``.
        self.want_compiled: Callable[[Shape], None] = lambda _shape: None
        self._report = report or (lambda _msg: None)
        self._shapes_run: set[tuple[int, ...]] = set()  # compiled (or loaded) step shapes

    def _blocks(self, seq: Sequence, n_tokens: int, width: int) -> np.ndarray:
        """The block table covering the first ``n_tokens`` of ``seq``, padded to ``width``
        entries with the scratch block 0."""
        out = np.zeros(width, I32)
        used = -(-n_tokens // self.block_size)
        out[:used] = seq.blocks[:used]
        return out

    def _where(self, seq: Sequence, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(block, offset) of positions ``start..stop-1`` of ``seq``."""
        pos = np.arange(start, stop)
        return np.asarray(seq.blocks, I32)[pos // self.block_size], (pos % self.block_size)

    @property
    def decode_weight_bytes(self) -> int:
        """Bytes of the weights a decode step multiplies with (every array read once; int8
        matrices count their int8 bytes plus their fp32 scales)."""
        return sum(int(a.size) * a.dtype.itemsize for a in jax.tree_util.tree_leaves(self.weights))

    def prepare(self, plan: StepPlan) -> Batch:
        if plan.kind == "decode":
            return self._prepare_decode(plan.decode)
        return self._prepare_prefill(plan)

    def _prepare_decode(self, seqs: list[Sequence]) -> Batch:
        b, _, p = self._padded(decode_need(self.buckets, seqs))
        arrs = _zeros(b, 1, p // self.block_size)
        for r, s in enumerate(seqs):
            n = s.num_computed
            arrs["tokens"][r, 0] = s.all_ids[n]
            arrs["positions"][r, 0] = n
            arrs["n_new"][r] = 1
            arrs["ctx_blocks"][r] = self._blocks(s, n, p // self.block_size)
            arrs["ctx_len"][r] = n
            arrs["write_blocks"][r], arrs["write_offsets"][r] = self._where(s, n, n + 1)
        return Batch(M.StepInputs(**arrs), np.zeros(b, I32), len(seqs))

    def _prepare_prefill(self, plan: StepPlan) -> Batch:
        items = plan.prefill
        b, t, p = self._padded(prefill_need(self.buckets, items))
        arrs = _zeros(b, t, p // self.block_size)
        last = np.zeros(b, I32)
        for r, it in enumerate(items):
            s, n, end = it.seq, it.length, it.start + it.length
            arrs["tokens"][r, :n] = s.all_ids[it.start : end]
            arrs["positions"][r] = np.arange(it.start, it.start + t)
            arrs["n_new"][r] = n
            arrs["ctx_blocks"][r] = self._blocks(s, it.start, p // self.block_size)
            arrs["ctx_len"][r] = it.start
            arrs["write_blocks"][r, :n], arrs["write_offsets"][r, :n] = self._where(
                s, it.start, end
            )
            last[r] = n - 1
        return Batch(M.StepInputs(**arrs), last, len(items))

    def execute(self, batch: Batch, want_logits: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Run the step; returns (token ids (rows,), logits (rows, vocab) or empty). A shape
        with no executable compiles first (see ``_call_step``). The engine reads only the
        token ids; the logits serve checks against a reference forward."""
        return self.collect(self.dispatch(batch, want_logits))

    def _padded(self, need: Shape) -> Shape:
        """The shape a plan padded to the buckets as ``need`` runs in: the cheapest shape
        compiled ahead of time that contains it (``compile_plan.serving_shape``), else
        ``need`` itself (compiled on first use)."""
        memo = self._serve_memo  # replaced, never cleared, when an executable is added
        got = memo.get(need)
        if got is None:
            compiled = list(self._compiled)
            if need in self._shapes_run:
                compiled.append(need)
            got = memo[need] = serving_shape(need, compiled) or need
            if got != need:
                self.want_compiled(need)
        return got

    def _call_step(self, *args: Any) -> Any:
        """The step for ``args`` (``M.make_sampling_step``'s arguments): the executable
        compiled ahead of time for its shape, else the jitted step, which compiles a new
        shape here, stalling every running stream for seconds; such a compile is reported
        and counted in ``serving_compiles`` (a shape the compile plan missed shows there)."""
        inp = next(a for a in args if isinstance(a, M.StepInputs))
        shape = (*inp.tokens.shape, inp.ctx_blocks.shape[1] * self.block_size)
        exe = self._compiled.get(shape)
        if exe is not None:
            return exe(*args)
        if shape in self._shapes_run:
            return self._jit_step(*args)
        t0 = time.perf_counter()
        out = self._jit_step(*args)
        self._shapes_run.add(shape)
        self.serving_compiles.append(shape)
        b, t, p = shape
        self._report(f"compiled step B={b} T={t} ctx={p} in {time.perf_counter() - t0:.1f}s")
        return out

    def compile_shape(self, shape: Shape) -> float:
        """Compile the step for ``shape`` ahead of time and use it from the next step on;
        returns the seconds it took (a persistent-cache hit loads instead of compiling).

        It lowers on abstract inputs (the live arrays' shapes, dtypes and shardings; the
        caches stay donated), so nothing runs and the live KV cache is not touched: any
        thread may call it while steps run. The first call must come before steps run
        (``Engine.start``) as it records the caches' abstract form."""
        if shape in self._compiled:
            return 0.0
        t0 = time.perf_counter()
        exe = self._jit_step.lower(*self._abstract_args(shape)).compile()
        self._compiled = {**self._compiled, shape: exe}  # copy-on-write: readers never lock
        self._serve_memo = {}
        return time.perf_counter() - t0

    def _abstract_args(self, shape: Shape) -> tuple[Any, ...]:
        """Abstract arguments of a step of ``shape``, exactly as ``dispatch`` passes them:
        (weights, k cache, v cache, inputs, logit index, sampling arrays, kept rows); inputs
        go through ``_put`` so they carry the placement real steps get."""
        if self._abstract is None:
            live = (self.weights, self.prefill_weights, self.k_cache, self.v_cache)
            self._abstract = _abstract(live)
        w, pre, k, v = self._abstract
        b, t, p = shape
        arrs = _zeros(b, t, p // self.block_size)
        host = (M.StepInputs(**arrs), np.zeros(b, I32), self._greedy(b), np.zeros(b, bool))
        inputs, li, sa, kept = _abstract(self._put(host))
        return (w if t == 1 else pre), k, v, inputs, li, sa, kept

    def _greedy(self, b: int) -> SamplingArrays:
        """Sampling arrays of ``b`` greedy rows."""
        return build_arrays([], b, self.vocab, END_WIDTH)

    def sampling_arrays(self, batch: Batch, rows: list[RowState | None]) -> None:
        """Set ``batch``'s sampling arrays from its rows' states (None: a row whose token is
        not used, e.g. a prefill chunk that does not end its prompt)."""
        b = batch.inputs.tokens.shape[0]
        batch.sampling = build_arrays(rows, b, self.vocab, END_WIDTH)
        batch.kept = np.zeros(b, bool)
        batch.kept[: len(rows)] = [r is not None for r in rows]

    @property
    def compiled_shapes(self) -> frozenset[Shape]:
        """Shapes with an executable compiled ahead of time."""
        return frozenset(self._compiled)

    def dispatch(self, batch: Batch, want_logits: bool, feed: Pending | None = None) -> Pending:
        """Start the step on the device and return at once (JAX dispatches asynchronously).

        ``feed``: a decode step still running (or done but unread) whose rows are this
        step's rows in the same order; its device tokens become this step's input tokens,
        so the host need not read them first (the one-step-behind loop)."""
        b = batch.inputs.tokens.shape[0]
        kept = batch.kept if batch.kept is not None else np.arange(b) < batch.rows
        if feed is not None:  # same rows: the tokens and sampling state stay on the device
            inputs, li, kept = self._put((batch.inputs, batch.logit_index, kept))
            fed = _fed_tokens(feed.top, b)
            inputs = inputs._replace(tokens=self._put(fed))  # the executables' placement
            sa = feed.sampling
        else:
            sa = batch.sampling if batch.sampling is not None else self._greedy(b)
            inputs, li, sa, kept = self._put((batch.inputs, batch.logit_index, sa, kept))
        w = self.weights if batch.inputs.tokens.shape[1] == 1 else self.prefill_weights
        logits, top, self.k_cache, self.v_cache, sa_next = self._step(
            w, self.k_cache, self.v_cache, inputs, li, sa, kept
        )
        return Pending(top, logits if want_logits else None, batch.rows, sa_next)

    @staticmethod
    def collect(pending: Pending) -> tuple[np.ndarray, np.ndarray]:
        """Wait for a dispatched step; (token ids (rows,), logits (rows, vocab) or empty)."""
        ids = np.asarray(pending.top)[: pending.rows]
        if pending.logits is None:
            return ids, np.empty((0, 0), np.float32)
        return ids, np.asarray(pending.logits)[: pending.rows]

    def _put(self, host: Any) -> Any:
        """Place a step's host inputs (a pytree of arrays) where the step reads them: on the
        device, or a full copy on every device of the tensor-parallel mesh."""
        return jax.device_put(host, self.placement.replicated)

    def warmup(self, shapes: list[Shape]) -> None:
        """Compile (or load from the persistent cache) each (batch, new tokens, context) shape
        ahead of time (``compile_shape``), reporting each."""
        for b, t, p in shapes:
            secs = self.compile_shape((b, t, p))
            self._report(f"compiled ahead of time: B={b} T={t} ctx={p} in {secs:.1f}s")


def _fed_tokens(top: Any, batch: int) -> Any:
    """The (batch, 1) input tokens of a chained decode step from the previous step's device
    tokens (rows beyond either step's padding are padding: token 0)."""
    rows = min(batch, top.shape[0])
    if top.shape[0] == batch:
        return top[:, None]
    return jnp.zeros((batch, 1), jnp.int32).at[:rows, 0].set(top[:rows])


def _abstract(tree: Any) -> Any:
    """``tree`` with every array replaced by its shape, dtype and sharding."""
    sds: Any = jax.ShapeDtypeStruct  # untyped in jax's stubs
    return jax.tree_util.tree_map(lambda x: sds(x.shape, x.dtype, sharding=x.sharding), tree)


def _zeros(b: int, t: int, nb: int) -> dict[str, np.ndarray]:
    """Padding everywhere: token 0 written to the scratch block 0, no context."""
    return {
        "tokens": np.zeros((b, t), I32),
        "positions": np.zeros((b, t), I32),
        "n_new": np.zeros(b, I32),
        "ctx_blocks": np.zeros((b, nb), I32),
        "ctx_len": np.zeros(b, I32),
        "write_blocks": np.zeros((b, t), I32),
        "write_offsets": np.zeros((b, t), I32),
    }


def device_dtype(name: str) -> Any:
    """``"float32"`` / ``"bfloat16"`` / ``"int8"`` (quantized weights, ``quant.py``) -> the jnp
    dtype."""
    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "int8": jnp.int8}[name]
