"""Token sampling on the host (NumPy): greedy, temperature, top-k, top-p, seeded, plus vLLM's
logits processors ``min_tokens`` and ``repetition_penalty``; and the checks of a request's
sampling values. The engine samples on the device (``device_sampling.py``); this module is
the plain reference its tests compare with.

Each sequence owns a ``Sampler`` with its own random generator, so a seeded request draws the
same numbers whatever else runs in its batch: same seed + prompt + params = same tokens.
Logits come back from the device as float32; the math here is float64.

Order, as vLLM's sampler: ``min_tokens`` first (the ids that would end the output get -inf
while fewer than ``min_tokens`` tokens exist), then the repetition penalty, then temperature,
top-k and top-p (or the argmax for greedy requests).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from local_tier.jax.api import EngineRequestError, SamplingParams

# Top-p first looks among this many best tokens; the full sort runs only when they do not
# reach top_p (rare: probability mass is usually concentrated).
_NUCLEUS_PROBE = 64


class Sampler:
    """Picks the next token of one sequence.

    ``prompt_ids`` feed the repetition penalty; ``end_ids`` are the ids ``min_tokens`` holds
    back: EOS (even under ``ignore_eos``, as vLLM) and ``stop_token_ids``.
    """

    def __init__(
        self,
        params: SamplingParams,
        prompt_ids: Sequence[int] = (),
        end_ids: Iterable[int] = (),
    ) -> None:
        self.temperature = params.temperature
        self.top_p = params.top_p
        self.top_k = params.top_k
        self.min_tokens = params.min_tokens
        self.repetition_penalty = params.repetition_penalty
        self.rng = np.random.default_rng(params.seed)
        self._end_ids = np.array(sorted(set(end_ids)), dtype=np.int64)
        self._prompt_ids = prompt_ids if self.repetition_penalty != 1.0 else ()
        self._seen: np.ndarray | None = None  # (vocab,) bool: in the prompt or the output
        self._seen_outputs = 0  # output ids already marked in ``_seen``

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def sample(self, logits: np.ndarray, output_ids: Sequence[int] = ()) -> int:
        """The next token id for ``logits`` (vocab,), after ``output_ids`` were generated."""
        x = self.processed(logits, output_ids)
        if self.greedy:
            return int(np.argmax(x))
        return sample_token(x, self.temperature, self.top_p, self.top_k, self.rng)

    def processed(self, logits: np.ndarray, output_ids: Sequence[int]) -> np.ndarray:
        """``logits`` after vLLM's processors for this step (a float64 copy when any
        applies, else ``logits`` itself)."""
        masking = len(output_ids) < self.min_tokens and self._end_ids.size > 0
        if not masking and self.repetition_penalty == 1.0:
            return logits
        x = logits.astype(np.float64)
        if masking:
            x[self._end_ids[self._end_ids < x.shape[0]]] = -np.inf
        if self.repetition_penalty != 1.0:
            apply_repetition_penalty(
                x, self._seen_mask(x.shape[0], output_ids), self.repetition_penalty
            )
        return x

    def _seen_mask(self, vocab: int, output_ids: Sequence[int]) -> np.ndarray:
        """Ids present in the prompt or the output, kept up to date incrementally (the
        output only grows)."""
        if self._seen is None:
            self._seen = np.zeros(vocab, dtype=bool)
            _mark(self._seen, self._prompt_ids)
        _mark(self._seen, output_ids[self._seen_outputs :])
        self._seen_outputs = len(output_ids)
        return self._seen


def _mark(mask: np.ndarray, ids: Sequence[int]) -> None:
    if len(ids):
        arr = np.asarray(ids, dtype=np.int64)
        mask[arr[(arr >= 0) & (arr < mask.shape[0])]] = True


def apply_repetition_penalty(logits: np.ndarray, seen: np.ndarray, penalty: float) -> None:
    """vLLM's (CTRL's) repetition penalty, in place: for every token in ``seen`` (the prompt
    or the output so far), a positive logit is divided by ``penalty`` and any other one
    multiplied by it, so ``penalty`` > 1 makes repeats less likely and < 1 more likely."""
    x = logits[seen]
    logits[seen] = np.where(x > 0, x / penalty, x * penalty)


def check_params(p: SamplingParams, vocab_size: int) -> None:
    """Raise ``EngineRequestError`` naming the field for a value that can never run (vLLM's
    rules; token ids must also lie in the vocabulary)."""
    if not (math.isfinite(p.temperature) and p.temperature >= 0):
        raise EngineRequestError("temperature must be a finite number >= 0", "temperature")
    if not (math.isfinite(p.top_p) and 0 < p.top_p <= 1):
        raise EngineRequestError("top_p must be in (0, 1]", "top_p")
    if p.top_k < 0:
        raise EngineRequestError("top_k must be >= 0 (0 disables it)", "top_k")
    if p.max_tokens is not None and p.max_tokens < 1:
        raise EngineRequestError("max_tokens must be >= 1", "max_tokens")
    if any(not isinstance(s, str) or not s for s in p.stop):
        raise EngineRequestError("stop strings must be non-empty strings", "stop")
    check_extensions(p, vocab_size)


def check_extensions(p: SamplingParams, vocab_size: int) -> None:
    """The checks of vLLM's extensions (``min_tokens``, ``stop_token_ids``,
    ``repetition_penalty``)."""
    if not (math.isfinite(p.repetition_penalty) and p.repetition_penalty > 0):
        raise EngineRequestError(
            f"repetition_penalty must be a finite number > 0, got {p.repetition_penalty}",
            "repetition_penalty",
        )
    if p.min_tokens < 0:
        raise EngineRequestError(f"min_tokens must be >= 0, got {p.min_tokens}", "min_tokens")
    if p.max_tokens is not None and p.min_tokens > p.max_tokens:
        raise EngineRequestError(
            f"min_tokens must be <= max_tokens={p.max_tokens}, got {p.min_tokens}",
            "min_tokens",
        )
    bad = [t for t in p.stop_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise EngineRequestError(
            f"stop_token_ids must be in [0, {vocab_size}), got {bad[:5]}", "stop_token_ids"
        )


def sample_token(
    logits: np.ndarray, temperature: float, top_p: float, top_k: int, rng: np.random.Generator
) -> int:
    """Draw from softmax(logits / temperature) restricted to the top-k tokens and then to the
    smallest set of most likely tokens whose probability reaches top_p. Logits of -inf
    (masked tokens) are never drawn."""
    x = logits.astype(np.float64) / temperature
    idx = np.arange(x.shape[0])
    if 0 < top_k < x.shape[0]:
        idx = np.argpartition(-x, top_k - 1)[:top_k]
        x = x[idx]
    p = np.exp(x - x.max())
    p /= p.sum()
    if top_p < 1.0:
        keep = _nucleus(p, top_p)
        idx, p = idx[keep], p[keep] / p[keep].sum()
    return int(idx[_draw(p, rng)])


def _nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """Indices into ``p`` of the most likely tokens whose cumulative probability first
    reaches ``top_p`` (at least one), in descending order of probability."""
    n = p.shape[0]
    if n > _NUCLEUS_PROBE:
        probe = np.argpartition(-p, _NUCLEUS_PROBE - 1)[:_NUCLEUS_PROBE]
        probe = probe[np.argsort(-p[probe], kind="stable")]
        cum = np.cumsum(p[probe])
        if cum[-1] >= top_p:
            return probe[: int(np.searchsorted(cum, top_p)) + 1]
    order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order])
    return order[: min(n, int(np.searchsorted(cum, top_p)) + 1)]


def _draw(p: np.ndarray, rng: np.random.Generator) -> int:
    cdf = np.cumsum(p)
    pick = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(pick, int(p.shape[0]) - 1)
