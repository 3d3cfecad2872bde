"""What attempts cut at their first-token deadline say about a target.

A cut attempt (``core.errors.AttemptDeadlineError``) waited ``w`` seconds without a first
token: its TTFT was more than ``w``, by how much nobody knows. It is not a measurement, so
it never enters the latency fits (a stand-in there would widen the spread and, read back
as the target's normal speed, lengthen the patience it is given next time). Instead each
target has:

- a *penalty*, a multiplier on its predicted TTFT: a cut multiplies it by ``CUT_FACTOR``
  (capped at ``MAX_PENALTY``) when the attempt started after the previous cut, i.e. was
  sent knowing the penalty (a burst of attempts sent together and cut together is one
  piece of evidence, not eight doublings); it decays back to 1 with a half-life of
  ``half_life_s`` and is dropped at the next real sample. A target that keeps missing
  deadlines looks slower and slower to the strategies, then drifts back to its measured
  figures when left alone (and gets tried again);
- a *floor*: the longest wait cut recently, what a target never measured is predicted
  at (times the penalty) instead of "unmeasured, try it";
- the *prompt size* it concerns: the smallest prompt (in tokens) among the cut attempts.
  The penalty applies to requests with at least ``PROMPT_SHARE`` of that prompt, and only
  a real sample for a prompt at least that large clears it: a target that starts short
  prompts in time but not long ones keeps its penalty for long ones while it keeps
  serving short ones.

Pure: time from the injected clock.
"""

from __future__ import annotations

from msgspec import Struct

from core.clock import Clock

CUT_FACTOR = 2.0
MAX_PENALTY = 16.0
PROMPT_SHARE = 0.5
_NEGLIGIBLE = 0.01  # a penalty within 1% of 1 is gone


class _Cuts(Struct):
    penalty: float
    floor_s: float
    at: float
    prompt_tokens: int


class CutPenalties:
    """Per target label: the penalty and floor from recent cut attempts."""

    def __init__(self, clock: Clock, half_life_s: float = 30.0) -> None:
        if half_life_s <= 0:
            raise ValueError("half_life_s must be > 0")
        self._clock = clock
        self.half_life_s = half_life_s
        self._cuts: dict[str, _Cuts] = {}

    def cut(self, label: str, waited_s: float, prompt_tokens: int = 0) -> None:
        """One attempt at ``label`` for a ``prompt_tokens`` prompt given up after
        ``waited_s`` (negative: ignored)."""
        if waited_s < 0:
            return
        known = self._live(label)
        now = self._clock.now()
        if known is None:
            self._cuts[label] = _Cuts(CUT_FACTOR, waited_s, now, max(0, prompt_tokens))
            return
        if now - waited_s >= known.at:  # sent after the last cut: new evidence
            known.penalty = min(self._penalty(known) * CUT_FACTOR, MAX_PENALTY)
            known.at = now
        known.floor_s = max(known.floor_s, waited_s)
        known.prompt_tokens = min(known.prompt_tokens, max(0, prompt_tokens))

    def sampled(self, label: str, prompt_tokens: int | None) -> None:
        """A real sample came in: it clears the penalty when its prompt is at least as
        large as the cut ones (None: size unknown, it clears it)."""
        known = self._cuts.get(label)
        if known is not None and (prompt_tokens is None or prompt_tokens >= known.prompt_tokens):
            del self._cuts[label]

    def age_s(self, label: str) -> float | None:
        """Seconds since ``label``'s last cut (None: none lately)."""
        known = self._live(label)
        return None if known is None else self._clock.now() - known.at

    def read(self, label: str) -> tuple[float, float | None, int]:
        """(penalty, floor seconds, the prompt size it applies from) now: (1.0, None, 0)
        when nothing was cut lately."""
        known = self._live(label)
        if known is None:
            return 1.0, None, 0
        return self._penalty(known), known.floor_s, int(known.prompt_tokens * PROMPT_SHARE)

    def _penalty(self, cuts: _Cuts) -> float:
        decay: float = 0.5 ** ((self._clock.now() - cuts.at) / self.half_life_s)
        return 1.0 + (cuts.penalty - 1.0) * decay

    def _live(self, label: str) -> _Cuts | None:
        cuts = self._cuts.get(label)
        if cuts is not None and self._penalty(cuts) - 1.0 < _NEGLIGIBLE:
            del self._cuts[label]
            return None
        return cuts
