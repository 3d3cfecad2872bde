"""Streaming text: incremental UTF-8-safe detokenization and stop-string holdback.

``IncrementalDetokenizer`` turns a growing list of token ids into text deltas without ever
emitting half a character: byte-level BPE can split one UTF-8 character over several tokens,
and decoding such a prefix yields U+FFFD, so text ending in U+FFFD is held until the next
token completes it (the method vLLM uses, with a prefix window so each step decodes only a
few tokens).

``StopFilter`` hides stop strings: it emits text only once it is sure that the text cannot be
the start of a stop string, and on a match it emits everything before the match (or up to its
end, with vLLM's ``include_stop_str_in_output``) and stops.
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
    """Holds back text that could begin a stop string; reports the first full match.

    vLLM's rules: the match that completes earliest in the text wins (ties: list order); a
    match must end in the text of the current ``push`` (it may begin in earlier text); text
    pushed with ``check=False`` (vLLM's first ``min_tokens`` tokens) is never searched, but a
    stop string that begins there and completes later still counts. With ``include`` the
    matched stop string stays in the output and nothing needs holding back.
    """

    def __init__(self, stops: Sequence[str], include: bool = False) -> None:
        self._stops = tuple(s for s in stops if s)
        self._include = include
        self._span = max((len(s) for s in self._stops), default=1) - 1
        self._held = ""  # text not emitted yet (it may begin a stop string)
        self._context = ""  # the end of the emitted text, where a later match may begin
        self.stopped = False

    def push(self, text: str, check: bool = True) -> str:
        """Text that is safe to emit now; sets ``stopped`` when a stop string completed."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        pending = self._held + text
        window = self._context + pending
        if check:
            hit = self._first_match(window, len(window) - len(text))
            if hit is not None:
                start, stop = hit
                self.stopped, self._held = True, ""
                end = start + len(stop) if self._include else start
                return window[len(self._context) : max(end, len(self._context))]
        keep = 0 if self._include else self._partial_len(pending)
        out = pending[: len(pending) - keep]
        self._held = pending[len(pending) - keep :]
        if self._include and self._span:  # excluded stops always begin in held text
            self._context = (self._context + out)[-self._span :]
        return out

    def flush(self) -> str:
        """At the end of generation (not stopped), the held-back text is real output."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out

    def _first_match(self, window: str, new_from: int) -> tuple[int, str] | None:
        """(start, stop) of the match ending earliest after ``new_from``, ties by order."""
        best: tuple[int, str] | None = None
        for stop in self._stops:
            start = window.find(stop, max(0, new_from - len(stop) + 1))
            if start >= 0 and (best is None or start + len(stop) < best[0] + len(best[1])):
                best = (start, stop)
        return best

    def _partial_len(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best
