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
- *evidence* before the penalty: each cut comes with its *surprise*, ``-log10`` of the
  chance that a target as its measurements say would still have been silent that long
  (at its p90: 1; at its p99: 2; never measured: infinite). The penalty starts once the
  cuts' surprise since the last real sample (which clears it) reaches ``EVIDENCE`` (2):
  one cut past the p99, two at the p90 (a deadline cut comes at the target's patience,
  its p90 or later), four at the p75 (a hedge's loser is stopped when the backup
  answers, often before its own median; an exploration probe is cut at the slack).
  Late together, they start one penalty, not two. Why 2 and not 1 (until session 15):
  a cut at the p90 happens to one attempt in ten of a healthy target, and a penalty at
  each, cleared only by a real sample of a prompt as long, kept `mid` penalised on long
  prompts for most of an end-to-end run before its outage (every 3 s RAG request cut at
  its patience doubled its RAG prediction, so RAG went to premium until the penalty had
  decayed). A first try of 2 had lost a point of the simulator's `summarise`
  class; with censored cuts (``policies.ttft_fit``) the simulator now gains on both
  counts (decision 0010, session 15).
- a *floor*: the longest wait cut recently, what a target never measured is predicted
  at (times the penalty) instead of "unmeasured, try it";
- the *prompt size* it concerns: the smallest prompt (in tokens) among the cut attempts.
  The penalty applies to requests with at least ``PROMPT_SHARE`` of that prompt, and only
  a real sample for such a prompt clears it: a target that starts short prompts in time
  but not long ones keeps its penalty for long ones while it keeps serving short ones;
- the *load* it concerns: the fewest requests in flight any cut attempt was sent with.
  The penalty applies while the target holds at least as many, and only a real sample
  sent at such a load clears it: a 4-slot box whose requests sent at 4 in flight queue
  and are cut keeps the penalty there while it answers quickly at 1-3 (end to end those
  answers dropped it within 2-3 s, and 800 ms requests kept going to the box at 4 in
  flight; decision 0010, session 24).

The prompt size and the load apply once the target has answered since its cuts began
(a real sample that did not clear them): until then it is not slow for some prompts or
loads, it answers nothing. A hang's cuts come as its requests in flight drain, so the
fewest in flight among them falls only as it drains: end to end, `mid` hung at 40 s,
its penalty covered 11 in flight or more by 44.7 s, 4 by 47.8 s, every load at 51.8 s,
and 3 s RAG requests sent there at 6-9 in flight in between were cut at its patience,
too late for premium to rescue them.

Pure: time from the injected clock.
"""

from __future__ import annotations

import math

from msgspec import Struct

from core.clock import Clock

CUT_FACTOR = 2.0
MAX_PENALTY = 16.0
EVIDENCE = 2.0  # -log10 of 1%: one cut past the target's p99, or two in its tail
PROMPT_SHARE = 0.5
_NEGLIGIBLE = 0.01  # a penalty within 1% of 1 is gone


class _Cuts(Struct):
    penalty: float  # 1.0 until the evidence is enough
    floor_s: float
    at: float
    prompt_tokens: int
    evidence: float = 0.0
    in_flight: int = 0  # the fewest requests in flight any of the cuts was sent with
    answered: bool = False  # a real sample since the cuts began (that did not clear them)


class CutPenalties:
    """Per target label: the penalty and floor from recent cut attempts."""

    def __init__(self, clock: Clock, half_life_s: float = 30.0) -> None:
        if half_life_s <= 0:
            raise ValueError("half_life_s must be > 0")
        self._clock = clock
        self.half_life_s = half_life_s
        self._cuts: dict[str, _Cuts] = {}

    def cut(
        self,
        label: str,
        waited_s: float,
        prompt_tokens: int = 0,
        surprise: float = math.inf,
        in_flight: int = 0,
    ) -> None:
        """One attempt at ``label`` for a ``prompt_tokens`` prompt given up after
        ``waited_s`` (negative: ignored), as surprising as ``surprise`` (see the module
        docstring; infinite by default: the penalty starts at once)."""
        if waited_s < 0:
            return
        known = self._live(label)
        now = self._clock.now()
        if known is None:
            known = self._cuts[label] = _Cuts(
                1.0, waited_s, now, max(0, prompt_tokens), in_flight=max(0, in_flight)
            )
            self._add_evidence(known, surprise)
            return
        if now - waited_s >= known.at:  # sent after the last cut: new evidence
            known.penalty = self._penalty(known)
            known.at = now
            self._add_evidence(known, surprise)
        elif known.penalty <= 1.0:  # cut alongside: adds evidence, starts one penalty
            self._add_evidence(known, surprise)
        known.floor_s = max(known.floor_s, waited_s)
        known.prompt_tokens = min(known.prompt_tokens, max(0, prompt_tokens))
        known.in_flight = min(known.in_flight, max(0, in_flight))

    def _add_evidence(self, known: _Cuts, surprise: float) -> None:
        known.evidence += max(0.0, surprise)
        if known.evidence >= EVIDENCE:
            known.penalty = min(known.penalty * CUT_FACTOR, MAX_PENALTY)

    def sampled(self, label: str, prompt_tokens: int | None, in_flight: int | None = None) -> None:
        """A real sample came in: it clears the penalty when its prompt is one the penalty
        applies to, at least ``PROMPT_SHARE`` of the smallest cut one (None: size unknown,
        it clears it), sent with at least as many in flight as the fewest any cut was
        (None: unknown, it clears it)."""
        known = self._cuts.get(label)
        if known is None:
            return
        long_enough = prompt_tokens is None or prompt_tokens >= known.prompt_tokens * PROMPT_SHARE
        loaded_enough = in_flight is None or in_flight >= known.in_flight
        if long_enough and loaded_enough:
            del self._cuts[label]
        else:
            known.answered = True

    def age_s(self, label: str) -> float | None:
        """Seconds since ``label``'s last cut (None: none lately, or no penalty yet)."""
        known = self._live(label)
        if known is None or known.penalty <= 1.0:
            return None
        return self._clock.now() - known.at

    def read(self, label: str) -> tuple[float, float | None, int, int]:
        """(penalty, floor seconds, the prompt size and the in-flight count it applies
        from) now: (1.0, None, 0, 0) when nothing was cut lately; every prompt and load
        (0, 0) until the target has answered since its cuts began."""
        known = self._live(label)
        if known is None:
            return 1.0, None, 0, 0
        if not known.answered:
            return self._penalty(known), known.floor_s, 0, 0
        share = int(known.prompt_tokens * PROMPT_SHARE)
        return self._penalty(known), known.floor_s, share, known.in_flight

    def _decay(self, cuts: _Cuts) -> float:
        return float(0.5 ** ((self._clock.now() - cuts.at) / self.half_life_s))

    def _penalty(self, cuts: _Cuts) -> float:
        return 1.0 + (cuts.penalty - 1.0) * self._decay(cuts)

    def _live(self, label: str) -> _Cuts | None:
        cuts = self._cuts.get(label)
        if cuts is None:
            return None
        # Evidence short of a penalty stays until a real sample clears it: the cuts were
        # in a row whatever the time between them.
        if cuts.penalty > 1.0 and self._penalty(cuts) - 1.0 < _NEGLIGIBLE:
            del self._cuts[label]
            return None
        return cuts
