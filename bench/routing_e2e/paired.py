"""The standard error of an attainment difference between two policies on the same trace.

Contract (pure): ``clustered_difference(a, b)`` takes, per policy, one list per seed of
``(block, met)`` pairs, one pair per request with an objective in trace order (the same
requests under both policies, so ``a[s][i]`` and ``b[s][i]`` are one request), and returns
``(mean difference, its standard error, number of clusters)``: the difference in the
share of requests that met their objective, a minus b.

Why this statistic. Each seed replays one trace through every policy, so the two
policies' outcomes are paired request by request: most requests meet (or miss) their
objective under both, and only the discordant ones carry information. Comparing the two
attainments as independent binomials ignores that pairing; taking the standard deviation
of the per-seed differences uses it but, with the two to four seeds a run affords, rests
on one to three degrees of freedom (with two seeds that differ by the same amount it
reads 0, and any shortfall fails). Per-request differences are not independent either: a
hang or a start-up misroutes several neighbours at once. So the differences are grouped
in clusters of ``BLOCK_S`` of trace time per seed, and the standard error is the
cluster-robust (sandwich) one over them: ``sqrt(G / (G - 1) x sum_c (sum_{i in c} (d_i -
mean))^2) / N`` for ``N`` requests in ``G`` clusters (Liang and Zeger 1986; the ``G / (G -
1)`` is the usual small-sample correction).
"""

from __future__ import annotations

import math
from collections import defaultdict

BLOCK_S = 20.0  # a cluster: as long as the benchmark's hang; a 600-request trace has 5


def block_of(at_s: float) -> int:
    """The cluster (block of ``BLOCK_S`` seconds of trace time) of a request arriving at
    ``at_s``."""
    return int(at_s // BLOCK_S)


def clustered_difference(
    a: list[list[tuple[int, bool]]], b: list[list[tuple[int, bool]]]
) -> tuple[float, float | None, int]:
    """(mean of a's met minus b's, its cluster-robust standard error, clusters): see the
    module docstring. The SE is None with fewer than two clusters or no requests. Raises
    ``ValueError`` when the two sides do not pair (other seeds, lengths or blocks)."""
    if len(a) != len(b):
        raise ValueError("the two policies ran different seeds")
    sums: dict[tuple[int, int], float] = defaultdict(float)
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for seed, (one, other) in enumerate(zip(a, b, strict=True)):
        if len(one) != len(other):
            raise ValueError("the two policies ran different traces")
        for (block, met_a), (block_b, met_b) in zip(one, other, strict=True):
            if block != block_b:
                raise ValueError("the two policies ran different traces")
            sums[seed, block] += int(met_a) - int(met_b)
            counts[seed, block] += 1
    n = sum(counts.values())
    if n == 0:
        return 0.0, None, 0
    mean = sum(sums.values()) / n
    clusters = len(sums)
    if clusters < 2:
        return mean, None, clusters
    spread = sum((sums[c] - mean * counts[c]) ** 2 for c in sums)
    return mean, math.sqrt(clusters / (clusters - 1) * spread) / n, clusters
