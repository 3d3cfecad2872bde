"""The console's CSRF checks (gateway/console/csrf.py): only requests from the console's
own pages pass (same origin by Sec-Fetch-Site or Origin); another site, another port of
the same host, an opaque origin or no origin at all are refused; the form token must be
the session's, compared in constant time."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.console.csrf import cross_site_reason, tokens_match

HOST = "127.0.0.1:8080"


@pytest.mark.parametrize(
    "headers",
    [
        {"sec-fetch-site": "same-origin", "origin": "http://127.0.0.1:8080"},
        {"sec-fetch-site": "same-origin"},
        {"sec-fetch-site": "none"},  # typed or bookmarked by the user
        {"origin": "http://127.0.0.1:8080"},  # a browser without fetch metadata
        {"origin": "https://127.0.0.1:8080"},  # TLS ended by a proxy in front
        {"origin": "HTTP://127.0.0.1:8080"},
    ],
)
def test_the_consoles_own_forms_pass(headers: dict[str, str]) -> None:
    assert cross_site_reason(headers, HOST) is None


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ({"sec-fetch-site": "cross-site", "origin": "http://evil.example"}, "another site"),
        ({"sec-fetch-site": "same-site", "origin": "http://127.0.0.1:9999"}, "another site"),
        ({"origin": "http://127.0.0.1:9999"}, "another origin"),
        ({"origin": "http://evil.example"}, "another origin"),
        ({"origin": "null"}, "opaque"),
        ({"sec-fetch-site": "same-origin", "origin": "null"}, "opaque"),
        ({}, "no origin"),
    ],
)
def test_anything_else_is_refused_with_its_reason(headers: dict[str, str], why: str) -> None:
    reason = cross_site_reason(headers, HOST)
    assert reason is not None and why in reason


def test_without_a_host_header_an_origin_cannot_be_checked() -> None:
    assert cross_site_reason({"origin": "http://127.0.0.1:8080"}, None) is not None


@given(st.from_regex(r"https?://[a-z0-9.]{1,20}(:[0-9]{1,5})?", fullmatch=True))
def test_no_other_origin_ever_passes(origin: str) -> None:
    netloc = origin.split("://", 1)[1]
    reason = cross_site_reason({"origin": origin}, HOST)
    assert (reason is None) == (netloc == HOST)


def test_tokens_must_match_exactly() -> None:
    assert tokens_match("abc", "abc")
    assert not tokens_match("abc", "abd")
    assert not tokens_match("abc", "ab")
    assert not tokens_match("abc", "")
    assert not tokens_match("", "")
    assert not tokens_match(None, None)
    assert not tokens_match("abc", None)
