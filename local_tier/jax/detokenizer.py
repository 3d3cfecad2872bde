"""Streaming text: incremental UTF-8-safe detokenization and stop-string holdback.

``IncrementalDetokenizer`` turns a growing list of token ids into text deltas without ever
emitting half a character: byte-level BPE can split one UTF-8 character over several tokens,
and decoding such a prefix yields U+FFFD, so text ending in U+FFFD is held until the next
token completes it (the method vLLM uses, with a prefix window so each step decodes only a
few tokens).

``StopFilter`` hides stop strings: it emits text only once it is sure that the text cannot be
the start of a stop string, and on a match it emits everything before the match and stops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"
Decode = Callable[[Sequence[int]], str]


class IncrementalDetokenizer:
    """Feed token ids, get the new text; ``flush`` returns whatever is still held."""

    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # ids before this are already emitted

    def push(self, ids: Sequence[int]) -> str:
        self._ids.extend(ids)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        if len(text) <= len(prefix_text) or text.endswith(REPLACEMENT):
            return ""  # incomplete character (or nothing visible) so far
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(prefix_text) :]

    def flush(self) -> str:
        """The held-back text, incomplete characters included (as U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return text[len(prefix_text) :] if len(text) > len(prefix_text) else ""


class StopFilter:
    """Holds back text that could begin a stop string; reports the first full match."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def push(self, text: str) -> str:
        """Text that is safe to emit now; sets ``stopped`` when a stop string appeared."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buf = self._held + text
        hits = [i for i in (buf.find(s) for s in self._stops) if i >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return buf[: min(hits)]
        keep = self._partial_len(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """At the end of generation (not stopped), the held-back text is real output."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out

    def _partial_len(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best
