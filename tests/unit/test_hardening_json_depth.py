"""The nesting-depth limit at the decode boundary (issue 10, defect 3): exact on valid
JSON, strings and escapes never count, and too-deep bodies are a 400 before decoding."""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InvalidRequestError
from core.wire import ChatRequest
from gateway.http.errors import MAX_JSON_DEPTH, decode_body, json_depth_exceeds

_chat = msgspec.json.Decoder(ChatRequest)


def depth_of(value: Any) -> int:
    """Reference: nesting depth of a decoded JSON value (a scalar is 0, ``[]`` is 1)."""
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 0


# strings full of the characters the scanner must see through
tricky = st.text(alphabet='[]{}"\\ab\n', max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | tricky,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(tricky, inner, max_size=4),
    max_leaves=60,
)


@settings(max_examples=300, deadline=None)
@given(json_values, st.integers(min_value=0, max_value=8))
def test_exact_on_valid_json(value: Any, limit: int) -> None:
    raw = json.dumps(value).encode()
    assert json_depth_exceeds(raw, limit) == (depth_of(value) > limit)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1])
def test_boundary(depth: int) -> None:
    raw = ("[" * depth + "]" * depth).encode()
    assert json_depth_exceeds(raw) == (depth > MAX_JSON_DEPTH)


def test_escaped_backslash_before_a_quote_ends_the_string() -> None:
    # "\\" is a whole string; the brackets after it are structure
    deep = "[" * 200 + "]" * 200
    assert json_depth_exceeds(('["\\\\", ' + deep + "]").encode())
    # "\"[[[..." is one string holding brackets
    assert not json_depth_exceeds(('["\\"' + "[" * 200 + '"]').encode())


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"model":"x","messages":[],"extra":' + b'{"a":' * 5000 + b"1" + b"}" * 5001,
    ],
)
def test_too_deep_is_a_400_before_decoding(raw: bytes) -> None:
    with pytest.raises(InvalidRequestError) as info:
        decode_body(_chat, raw)
    assert info.value.status == 400
    assert info.value.code == "json_too_deep"
    assert f"deeper than {MAX_JSON_DEPTH} levels" in info.value.message


def test_a_recursion_error_in_the_decoder_is_a_400() -> None:
    """The backstop: even past the scan, the decoder's RecursionError is never a 500."""

    class Deep:
        def decode(self, raw: bytes) -> Any:
            raise RecursionError("maximum recursion depth exceeded")

    with pytest.raises(InvalidRequestError):
        decode_body(Deep(), b"{}")  # type: ignore[arg-type]


def test_cost_on_a_one_megabyte_body_is_small() -> None:
    """A generous bound (shared CI machines): the scan of a 1 MB chat body with thousands
    of messages, or of 1 MB of brackets, stays within tens of milliseconds."""
    messages = [{"role": "user", "content": 'text [with] {brackets} "and" \\ ' * 20}] * 1500
    chat = json.dumps({"model": "m", "messages": messages}).encode()
    hostile = b"[[]," * 250_000
    for raw in (chat, hostile):
        started = time.perf_counter()
        json_depth_exceeds(raw)
        assert time.perf_counter() - started < 0.25
