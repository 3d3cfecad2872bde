"""Token sampling on the host (NumPy): greedy, temperature, top-k, top-p, seeded.

Each sequence owns a ``Sampler`` with its own random generator, so a seeded request draws the
same numbers whatever else runs in its batch: same seed + prompt + params = same tokens.
Logits come back from the device as float32; the math here is float64.
"""

from __future__ import annotations

import numpy as np

from local_tier.jax.api import SamplingParams

# Top-p first looks among this many best tokens; the full sort runs only when they do not
# reach top_p (rare: probability mass is usually concentrated).
_NUCLEUS_PROBE = 64


class Sampler:
    """Picks the next token of one sequence."""

    def __init__(self, params: SamplingParams) -> None:
        self.temperature = params.temperature
        self.top_p = params.top_p
        self.top_k = params.top_k
        self.rng = np.random.default_rng(params.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def sample(self, logits: np.ndarray) -> int:
        """The next token id for ``logits`` (vocab,)."""
        if self.greedy:
            return int(np.argmax(logits))
        return sample_token(logits, self.temperature, self.top_p, self.top_k, self.rng)


def sample_token(
    logits: np.ndarray, temperature: float, top_p: float, top_k: int, rng: np.random.Generator
) -> int:
    """Draw from softmax(logits / temperature) restricted to the top-k tokens and then to the
    smallest set of most likely tokens whose probability reaches top_p."""
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
