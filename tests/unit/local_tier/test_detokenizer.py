"""Incremental UTF-8-safe detokenization and stop-string holdback, with a fake byte-level
vocabulary (each token is some bytes)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from local_tier.jax.detokenizer import IncrementalDetokenizer, StopFilter

VOCAB = {i: bytes([i]) for i in range(256)}


def decode(ids: Sequence[int]) -> str:
    return b"".join(VOCAB[i] for i in ids).decode("utf-8", errors="replace")


def stream(text: str) -> list[str]:
    d = IncrementalDetokenizer(decode)
    pieces = [d.push([b]) for b in text.encode()]
    return [*pieces, d.flush()]


def test_multibyte_characters_are_never_split() -> None:
    pieces = stream("héllo 世界 🎉!")
    assert "".join(pieces) == "héllo 世界 🎉!"
    assert all("\ufffd" not in p for p in pieces)


@given(st.text(max_size=40))
def test_any_text_round_trips(text: str) -> None:
    """No piece ever shows a replacement character the text does not have (a split
    multi-byte character would); U+FFFD in the text itself passes through as itself."""
    pieces = stream(text)
    assert "".join(pieces) == text
    assert sum(p.count("\ufffd") for p in pieces) == text.count("\ufffd")


def test_incomplete_tail_is_flushed_as_replacement() -> None:
    d = IncrementalDetokenizer(decode)
    assert d.push(list(b"ok")) == "ok"
    assert d.push(["é".encode()[0]]) == ""
    assert d.flush() == "\ufffd"


def feed(stops: list[str], chunks: list[str]) -> tuple[list[str], bool]:
    f = StopFilter(stops)
    out = [f.push(c) for c in chunks]
    if not f.stopped:
        out.append(f.flush())
    return out, f.stopped


def test_stop_string_is_cut_and_never_leaks_partially() -> None:
    out, stopped = feed(["END"], ["Hello E", "N", "D tail"])
    assert stopped and "".join(out) == "Hello "
    assert out[0] == "Hello "  # "E" held back: it might start "END"
    assert out[1] == ""


def test_false_alarm_prefix_is_released() -> None:
    out, stopped = feed(["END"], ["an E", "ND? no: EN", "X"])
    assert stopped and "".join(out) == "an "
    out, stopped = feed(["STOP"], ["ST", "ART"])
    assert not stopped and "".join(out) == "START" and out[0] == ""


def test_held_text_is_emitted_at_the_end() -> None:
    out, stopped = feed(["###"], ["a #", "#"])
    assert not stopped and "".join(out) == "a ##"


def test_earliest_of_several_stops_wins() -> None:
    out, stopped = feed(["b", "cd"], ["xxcdb"])
    assert stopped and "".join(out) == "xx"


@given(st.text(alphabet="abE", max_size=30), st.integers(1, 5))
def test_output_never_contains_stop_and_is_a_prefix(text: str, size: int) -> None:
    chunks = [text[i : i + size] for i in range(0, len(text), size)]
    out, stopped = feed(["bE"], chunks)
    joined = "".join(out)
    assert "bE" not in joined
    assert joined == (text[: text.find("bE")] if stopped else text)
