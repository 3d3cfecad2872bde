"""The verdict's statistic: the attainment difference of two policies on one trace, paired
by request and clustered in blocks of trace time (``bench.routing_e2e.paired``)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.routing_e2e.paired import BLOCK_S, block_of, clustered_difference


def _pairs(mets: list[bool], per_block: int) -> list[tuple[int, bool]]:
    return [(i // per_block, met) for i, met in enumerate(mets)]


def test_a_difference_worked_by_hand():
    # One seed, two blocks of two requests; a misses request 0, b misses request 3.
    a = [_pairs([False, True, True, True], 2)]
    b = [_pairs([True, True, True, False], 2)]
    diff, se, clusters = clustered_difference(a, b)
    # d = (-1, 0 | 0, 1): mean 0; block sums -1 and +1; SE = sqrt(2 / 1 x 2) / 4
    assert (diff, clusters) == (0.0, 2)
    assert se == pytest.approx(math.sqrt(4.0) / 4)


def test_seeds_are_clusters_of_their_own_and_must_pair():
    a = [_pairs([False] * 3, 10), _pairs([True] * 3, 10)]
    b = [_pairs([True] * 3, 10), _pairs([True] * 3, 10)]
    diff, se, clusters = clustered_difference(a, b)
    assert clusters == 2 and diff == pytest.approx(-0.5)
    # block sums -3 and 0 around a mean of -0.5 x 3: (-1.5)^2 + 1.5^2, x 2/1, over N = 6
    assert se == pytest.approx(math.sqrt(2 * 4.5) / 6)
    with pytest.raises(ValueError):
        clustered_difference(a, b[:1])
    with pytest.raises(ValueError):
        clustered_difference(a, [b[0], b[1][:2]])
    with pytest.raises(ValueError):
        clustered_difference([_pairs([True], 1)], [[(5, True)]])


def test_one_cluster_or_no_request_has_no_standard_error():
    assert clustered_difference([_pairs([True, False], 10)], [_pairs([True, True], 10)])[1:] == (
        None,
        1,
    )
    assert clustered_difference([[]], [[]]) == (0.0, None, 0)


def test_misses_that_come_together_count_as_one_event_not_many():
    """Ten misses in one block of one policy against none: a cluster-robust SE sees one
    bad block, so the SE is as large as the shortfall, where treating the requests as
    independent (one request per cluster) makes it look over three times surer."""
    mets = [False] * 10 + [True] * 90
    a, b = [_pairs(mets, 10)], [_pairs([True] * 100, 10)]
    diff, clustered, _ = clustered_difference(a, b)
    _, independent, _ = clustered_difference([_pairs(mets, 1)], [_pairs([True] * 100, 1)])
    assert diff == pytest.approx(-0.1)
    assert clustered is not None and independent is not None
    assert clustered > 3 * independent


@given(
    st.lists(st.tuples(st.integers(0, 4), st.booleans(), st.booleans()), min_size=1, max_size=60)
)
def test_the_difference_is_antisymmetric_and_bounded(rows):
    rows = sorted(rows)  # trace order: blocks never go back
    a = [[(block, x) for block, x, _ in rows]]
    b = [[(block, y) for block, _, y in rows]]
    ab, ba = clustered_difference(a, b), clustered_difference(b, a)
    assert ab[0] == pytest.approx(-ba[0]) and -1.0 <= ab[0] <= 1.0
    assert ab[1] == ba[1] or ab[1] == pytest.approx(ba[1])
    assert clustered_difference(a, a)[:2] in ((0.0, 0.0), (0.0, None))


def test_blocks_follow_trace_time():
    assert [block_of(t) for t in (0.0, BLOCK_S - 0.01, BLOCK_S, 5 * BLOCK_S + 1)] == [0, 0, 1, 5]
