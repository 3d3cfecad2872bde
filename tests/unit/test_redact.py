"""Redaction of free text: e-mail addresses and API-key-like strings are replaced, ids the
gateway logs on purpose (request ids, trace ids, UUIDs, key ids) are not, and the log
processor applies it to free-text fields of every line."""

from __future__ import annotations

import json

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from core.config import LoggingConfig
from gateway.process.observe import configure_logging
from gateway.process.redact import REDACTED, Redactor

REDACT = Redactor().redact


@pytest.mark.parametrize(
    "secret",
    [
        "jane.doe+tag@example.co.uk",
        "o'brien!x@mail-server.example",
        "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx0123",
        "sk-ant-api03-abcdefghijklmnopqrstuvwxyz012345-_",
        "sk-0123456789abcdefABCDEF",
        "AIzaSyA-1234567890abcdefghijklmnopqrstu",
        "AKIAIOSFODNN7EXAMPLE",
        "ghp_0123456789abcdefghijABCDEFGHIJ012345",
        "xoxb-1234567890-abcdefghij",
        "sy-0123456789ab-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789_-abcde",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJl",
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",  # 64 hex
        "QWxhZGRpbjpvcGVuIHNlc2FtZQ9xYzQ1NjdhYmNkZWY=",  # mixed base64
    ],
)
def test_secrets_are_replaced_wherever_they_sit(secret):
    for text in (secret, f"x {secret} y", f'{{"k": "{secret}"}}', f"({secret}),"):
        out = REDACT(text)
        assert secret not in out and REDACTED in out, (text, out)


def test_bearer_tokens_lose_their_token_in_any_case():
    for header in ("Authorization: Bearer abc.def-123456", "authorization: BEARER abcdefgh123"):
        out = REDACT(header)
        assert out.endswith(REDACTED) and "123" not in out


@pytest.mark.parametrize(
    "text",
    [
        "req_0123456789abcdef01234567",  # the gateway's request ids
        "trace 4bf92f3577b34da6a3ce929d0e0e4736 span 00f067aa0ba902b7",
        "123e4567-e89b-12d3-a456-426614174000",
        "key 0123456789ab tenant acme",
        "gpt-4o-mini-2024-07-18 claude-3-5-sonnet-20241022 meta-llama/Llama-3.1-8B-Instruct",
        "task-0123456789abcdefghij and desk-organiser-with-drawers",
        "http://127.0.0.1:4318/v1/traces",
        "supercalifragilisticexpialidocious-antidisestablishmentarianism",  # long, no digits
        "The server had an error processing your request. Sorry about that!",
        "user at example dot com; a@b is not an address",
    ],
)
def test_ids_names_and_prose_stay_readable(text):
    assert REDACT(text) == text


def test_nothing_to_redact_returns_the_same_object():
    text = "upstream said: rate limit reached for requests, id req_0123456789abcdef01234567"
    assert REDACT(text) is text


def test_hex_inside_a_longer_identifier_is_still_caught():
    digest = "0a1b" * 10
    assert REDACT(f"key_{digest}") == f"key_{REDACTED}"


def test_operator_patterns_apply_with_their_own_flags():
    redactor = Redactor([r"(?i)acct-\d{6}", r"\b\d{3}-\d{2}-\d{4}\b"])
    out = redactor.redact("ACCT-123456 and 078-05-1120 and acct-12")
    assert out == f"{REDACTED} and {REDACTED} and acct-12"


def test_long_runs_are_linear():
    # a pattern that restarted inside long runs would take seconds here
    for text in ("a" * 200_000, "a." * 100_000, "@" + "a" * 200_000, "sk-" * 70_000):
        REDACT(text)


# local parts with every character RFC 5322 allows unquoted; plain domain labels
_LOCAL = st.text("abcXYZ0189!#$%&'*+/=?^_`{|}~-.", min_size=1)
_LABEL = st.text("abcxyz0189-", min_size=1)


@given(
    st.one_of(st.emails(), st.builds("{}@{}.{}".format, _LOCAL, _LABEL, _LABEL)),
    st.text(),
    st.text(),
)
def test_no_email_of_the_input_survives(email, before, after):
    assert email not in REDACT(before + email + after)


@given(st.text(alphabet=st.characters(blacklist_characters="@"), max_size=200))
def test_redaction_is_idempotent(text):
    once = REDACT(text)
    assert REDACT(once) == once


def test_log_lines_are_redacted(capsys):
    configure_logging(LoggingConfig(level="info", json=True), cache=False, redact=[r"acct-\d+"])
    try:
        log = structlog.get_logger("switchyard")
        log.warning("upstream.failed", error="bad key sk-proj-AbCdEfGhIjKlMnOpQrStUv", model="m")
        log.info("note", detail=["mail jane@example.com", "acct-42"], tenant="acme")
        log.info("long", note="x " * 40 + "reach me at bob@example.org")
        try:
            raise ValueError("token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln leaked")
        except ValueError:
            log.exception("request.failed", request_id="req_0123456789abcdef01234567")
    finally:
        structlog.reset_defaults()
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["error"] == f"bad key {REDACTED}" and lines[0]["model"] == "m"
    assert lines[1]["detail"] == [f"mail {REDACTED}", REDACTED] and lines[1]["tenant"] == "acme"
    assert lines[2]["note"].endswith(f"reach me at {REDACTED}")
    assert "eyJ" not in lines[3]["exception"] and "ValueError" in lines[3]["exception"]
    assert lines[3]["request_id"] == "req_0123456789abcdef01234567"
