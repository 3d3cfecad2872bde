"""Redaction of secrets and personal data in free text (log lines, captured span content).

``Redactor(patterns).redact(text)`` replaces every match of the built-in patterns (e-mail
addresses, API-key-like strings) and of the operator's own (``observability.redact``) with
``REDACTED``. What counts as API-key-like:

- vendor keys with a known prefix: OpenAI/Anthropic ``sk-...`` (``sk-proj-``, ``sk-ant-``),
  Google ``AIza...``, AWS ``AKIA...``/``ASIA...``, GitHub ``ghp_...``-style, Slack
  ``xox?-...``, and the gateway's own ``sy-<key_id>-<secret>``;
- ``Bearer <token>`` and JWTs (``eyJ...x.y.z``);
- long secrets without a prefix: a run of 40+ hex digits, or a run of 32+ characters of the
  base64 alphabets that mixes upper case, lower case and digits.

Request ids (``req_`` + 24 hex), W3C trace ids (32 hex), span ids, UUIDs, key ids and model
names stay readable: none is long enough or mixed enough to match.

Cost: every pattern is guarded by a substring test (``"@" in text``, ``"sk-" in text``...)
or, for the prefix-less runs, by the length of the longest whitespace-free token, both
done in C; a short text that holds nothing to redact costs about a microsecond. Every
pattern starts at a boundary its own character class cannot cross, so a pass is linear in
the text's length (no pattern restarts inside a long run of letters to scan it again).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "[redacted]"

_B64_CLASS = r"[A-Za-z0-9+/_\-]"
_ATEXT = r"A-Za-z0-9!#$%&'*+/=?^_`{|}~.\-"
# (a substring every match contains, the pattern)
_PREFIXED: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (literal, re.compile(pattern, re.ASCII))
    for literal, pattern in (
        # e-mail: the local part is any run of RFC 5322 "atext" and dots (a match starts
        # where that run starts, so it is linear); the domain has at least one dot
        ("@", rf"(?<![{_ATEXT}])[{_ATEXT}]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)+"),
        # the literal first, then the boundary before it: the regex engine then searches
        # for the literal instead of trying every position
        ("eyJ", r"eyJ(?<![\w\-]eyJ)[\w\-]+\.[\w\-]+\.[\w\-]*"),
        ("sk-", r"sk-(?<![\w\-]sk-)[\w\-]{16,}"),
        ("sy-", r"sy-(?<![\w\-]sy-)[0-9a-f]{12}-[\w\-]{16,}"),
        ("AIza", r"AIza(?<![\w\-]AIza)[\w\-]{30,}"),
        ("AKIA", r"AKIA(?<![\w]AKIA)[0-9A-Z]{16}(?![0-9A-Z])"),
        ("ASIA", r"ASIA(?<![\w]ASIA)[0-9A-Z]{16}(?![0-9A-Z])"),
        ("gh", r"gh[pousr]_(?<![\w]gh[pousr]_)[A-Za-z0-9]{30,}"),
        ("xox", r"xox[abposr]-(?<![\w\-]xox[abposr]-)[A-Za-z0-9\-]{10,}"),
    )
)
_BEARER = re.compile(r"\bbearer\s+[A-Za-z0-9._~+/=\-]{8,}", re.IGNORECASE)
_RUN = re.compile(_B64_CLASS + r"{32,}=*")
_HEX40 = re.compile(r"(?<![0-9A-Fa-f])[0-9A-Fa-f]{40,}(?![0-9A-Fa-f])")
_RUN_MIN = 32


class Redactor:
    """Replaces secrets and personal data in text with ``REDACTED``.

    ``patterns``: the operator's extra regular expressions (``observability.redact``; the
    config loader has checked that they compile). Each is compiled on its own, so inline
    flags such as ``(?i)`` keep working."""

    __slots__ = ("_extra",)

    def __init__(self, patterns: Iterable[str] = ()) -> None:
        self._extra = tuple(re.compile(pattern) for pattern in patterns)

    def redact(self, text: str) -> str:
        """``text`` with every match replaced (the same object when nothing matched)."""
        for literal, pattern in _PREFIXED:
            if literal in text:
                text = pattern.sub(REDACTED, text)
        if "earer" in text or "EARER" in text:
            text = _BEARER.sub(REDACTED, text)
        if _longest_token(text) >= _RUN_MIN:
            text = _RUN.sub(_secret_run, text)
        for extra in self._extra:
            text = extra.sub(REDACTED, text)
        return text


def _longest_token(text: str) -> int:
    """The length of the longest whitespace-free stretch: a base64 run never crosses
    whitespace, so below ``_RUN_MIN`` there is none to look for."""
    if len(text) < _RUN_MIN:
        return len(text)
    return max(map(len, text.split()), default=0)


def _secret_run(match: re.Match[str]) -> str:
    """A long base64-alphabet run: redacted when it mixes upper case, lower case and
    digits; else only the 40+ hex stretches inside it (e.g. ``key_<sha1>``)."""
    run = match.group()
    has_digit = has_lower = has_upper = False
    for char in run:
        has_digit = has_digit or char.isdigit()
        has_lower = has_lower or char.islower()
        has_upper = has_upper or char.isupper()
    if has_digit and has_lower and has_upper:
        return REDACTED
    return _HEX40.sub(REDACTED, run) if has_digit else run
