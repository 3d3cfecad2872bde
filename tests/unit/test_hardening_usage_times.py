"""Usage-export time filters (issue 10, defect 5): out-of-range, non-finite and unparsable
times are a 400 naming the parameter; the whole range 1970..9999 stays usable."""

from __future__ import annotations

import pytest

from core.errors import InvalidRequestError
from policies.ledger.export import LATEST_S, parse_query, parse_time


@pytest.mark.parametrize(
    "value",
    ["1e308", "-1e20", "-0.5", "inf", "-inf", "nan", "1e20", "253402300801",
     "9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+01:00", "1969-12-31T23:59:59", "2024-02-30",
     "x" * 10_000],
)  # fmt: skip
@pytest.mark.parametrize("param", ["from", "to"])
def test_bad_times_are_400_naming_the_parameter(value: str, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_time(value, param, end=param == "to")
    assert info.value.status == 400
    assert info.value.param == param
    assert len(info.value.message) < 300  # the value is quoted, but not all of it


@pytest.mark.parametrize(
    ("value", "end", "expected"),
    [
        ("0", False, 0.0),
        ("1970-01-01", False, 0.0),
        ("9999-12-31", True, LATEST_S),  # the day after 9999-12-31 is not a date
        ("9999-12-31T23:59:59Z", False, LATEST_S - 1),
        ("2024-05-01", True, 1714608000.0),
        ("2024-05-01T02:00:00+02:00", False, 1714521600.0),
    ],
)
def test_the_whole_range_is_usable(value: str, end: bool, expected: float) -> None:
    assert parse_time(value, "to" if end else "from", end=end) == expected


def test_a_query_over_all_time_parses() -> None:
    query = parse_query(start="1970-01-01", end="9999-12-31")
    assert (query.start, query.end) == (0.0, LATEST_S)
