"""JWT hardening (issue 10, defect 7): ``iat`` in the future beyond the leeway is refused,
and tokens larger than ``auth.jwt.max_token_bytes`` are refused before any decoding or
signature work. Injected clock, as in test_auth_jwt.py."""

from __future__ import annotations

from unittest import mock

import jwt
import pytest

from core.clock import FakeClock
from tests.unit.test_auth_jwt import SECRET, bearer, claims, make_auth, rejected

HS = {"algorithms": ["HS256"], "secret_env": "JWT_SECRET"}
ENV = {"JWT_SECRET": SECRET}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_iat_beyond_the_leeway_is_refused(tmp_path, clock) -> None:
    auth = make_auth(tmp_path, clock, env=ENV, **HS)
    inside = jwt.encode(claims(clock, iat=clock.wall() + 30), SECRET, algorithm="HS256")
    assert auth.authenticate(bearer(inside)).tenant == "acme"  # within the 30 s leeway
    future = jwt.encode(claims(clock, iat=clock.wall() + 31), SECRET, algorithm="HS256")
    rejected(auth, future, "issued in the future")


def test_iat_must_be_a_number(tmp_path, clock) -> None:
    auth = make_auth(tmp_path, clock, env=ENV, **HS)
    token = jwt.encode(claims(clock, iat="yesterday"), SECRET, algorithm="HS256")
    rejected(auth, token, "iat")


def test_iat_in_the_past_and_absent_are_fine(tmp_path, clock) -> None:
    auth = make_auth(tmp_path, clock, env=ENV, **HS)
    past = jwt.encode(claims(clock, iat=clock.wall() - 3600), SECRET, algorithm="HS256")
    assert auth.authenticate(bearer(past)).tenant == "acme"
    assert auth.authenticate(bearer(jwt.encode(claims(clock), SECRET))).tenant == "acme"


def test_an_oversized_token_is_refused_before_any_decoding(tmp_path, clock) -> None:
    auth = make_auth(tmp_path, clock, env=ENV, max_token_bytes=4096, **HS)
    big = jwt.encode(claims(clock, pad="x" * 4096), SECRET, algorithm="HS256")
    with mock.patch("jwt.get_unverified_header") as header, mock.patch("jwt.decode") as decode:
        rejected(auth, big, "larger than 4096 bytes")
    header.assert_not_called()
    decode.assert_not_called()
    small = jwt.encode(claims(clock, pad="x" * 2000), SECRET, algorithm="HS256")
    assert auth.authenticate(bearer(small)).tenant == "acme"


def test_the_default_cap_is_16_kib(tmp_path, clock) -> None:
    auth = make_auth(tmp_path, clock, env=ENV, **HS)
    rejected(auth, jwt.encode(claims(clock, pad="x" * 256 * 1024), SECRET), "larger than 16384")
    fits = jwt.encode(claims(clock, pad="x" * 10_000), SECRET, algorithm="HS256")
    assert auth.authenticate(bearer(fits)).tenant == "acme"
