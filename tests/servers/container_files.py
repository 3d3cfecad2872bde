"""The Dockerfile, .dockerignore and compose.yaml as data, for tests that check them without
a Docker engine: a Dockerfile reader (instructions by build stage, exec-form arguments,
HEALTHCHECK options), the .dockerignore matching rules of Docker's build context, and the
compose file with its policy."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
COMPOSE = ROOT / "compose.yaml"


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction; ``stage`` counts FROMs (-1: before the first)."""

    keyword: str
    args: str
    stage: int

    def exec_form(self) -> list[str]:
        """The JSON-array arguments (``CMD ["a", "b"]``)."""
        value = json.loads(self.args)
        assert isinstance(value, list), self.args
        return [str(v) for v in value]


def _logical_lines(text: str) -> list[str]:
    """Lines with ``\\`` continuations joined; comment and blank lines dropped (Docker
    drops comment lines inside a continuation too)."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    if pending:
        lines.append(pending)
    return lines


def parse_dockerfile(text: str) -> list[Instruction]:
    instructions: list[Instruction] = []
    stage = -1
    for line in _logical_lines(text):
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        instructions.append(Instruction(keyword, args.strip(), stage))
    return instructions


def dockerfile() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text())


def healthcheck_command(instruction: Instruction) -> tuple[dict[str, str], list[str]]:
    """``HEALTHCHECK --opt=value ... CMD [...]`` -> (options, exec-form command)."""
    options: dict[str, str] = {}
    rest = instruction.args
    while rest.startswith("--"):
        option, _, rest = rest.partition(" ")
        name, _, value = option[2:].partition("=")
        options[name] = value
        rest = rest.strip()
    keyword, _, command = rest.partition(" ")
    assert keyword == "CMD", instruction.args
    return options, Instruction("CMD", command.strip(), instruction.stage).exec_form()


# --------------------------------------------------------------------------- .dockerignore
def _glob_regex(pattern: str) -> re.Pattern[str]:
    """Go's filepath.Match syntax plus ``**`` (any number of folders), as Docker reads it."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


@dataclass(frozen=True)
class IgnoreRules:
    """A .dockerignore: the last pattern that matches a path (or one of its parent folders)
    decides; a ``!`` pattern puts the path back into the build context."""

    rules: tuple[tuple[bool, str, re.Pattern[str]], ...]  # (keep, pattern, regex)

    @classmethod
    def parse(cls, text: str) -> IgnoreRules:
        rules = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            keep = line.startswith("!")
            pattern = str(PurePosixPath(line.lstrip("!").strip().lstrip("/")))
            rules.append((keep, pattern, _glob_regex(pattern)))
        return cls(tuple(rules))

    def excluded(self, path: str) -> bool:
        parts = PurePosixPath(path).parts
        candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        verdict = False
        for keep, _, regex in self.rules:
            if any(regex.match(candidate) for candidate in candidates):
                verdict = not keep
        return verdict

    def may_keep_below(self, folder: str) -> bool:
        """Whether a ``!`` pattern could put back something under an excluded ``folder``
        (else the folder need not be walked)."""
        return any(keep and pattern.startswith(folder + "/") for keep, pattern, _ in self.rules)


def dockerignore() -> IgnoreRules:
    return IgnoreRules.parse(DOCKERIGNORE.read_text())


def context_files(rules: IgnoreRules) -> list[str]:
    """Every file of the working tree that Docker would send as the build context."""
    files = []
    for folder, subfolders, names in os.walk(ROOT):
        where = Path(folder).relative_to(ROOT)
        for sub in list(subfolders):
            relative = (where / sub).as_posix()
            if rules.excluded(relative) and not rules.may_keep_below(relative):
                subfolders.remove(sub)
        for name in names:
            relative = (where / name).as_posix()
            if not rules.excluded(relative):
                files.append(relative)
    return sorted(files)


# ------------------------------------------------------------------------------- compose
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def duration_s(value: str) -> float:
    """A compose duration such as ``75s``, ``1m30s``."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", value)
    assert parts and "".join(n + u for n, u in parts) == value, value
    return sum(float(n) * units[u] for n, u in parts)
