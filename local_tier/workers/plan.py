"""What a new ``workers:`` section asks of the running replicas (pure).

A *slot* is one replica place, ``(entry name, replica index)``; its ``LaunchSpec`` says what
runs there. Comparing the slots of the old and the new section gives, per slot:

- ``start``: only in the new section (a new entry, or more replicas);
- ``stop``: only in the old one (an entry removed, or fewer replicas);
- ``replace``: in both, with another spec (the new process is started, the old one stopped,
  in the entry's ``replace`` order, one replica of an entry at a time);
- ``keep``: the same spec (the process is untouched; settings that do not change what runs,
  such as timeouts and the backoff, take effect in place).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from core.config_workers import WorkerConfig
from local_tier.workers.launch import LaunchSpec, launch_spec

SlotKey = tuple[str, int]  # (entry name, replica index)


@dataclass(frozen=True)
class Plan:
    start: list[SlotKey] = field(default_factory=list)
    keep: list[SlotKey] = field(default_factory=list)
    replace: list[SlotKey] = field(default_factory=list)
    stop: list[SlotKey] = field(default_factory=list)

    @property
    def unchanged(self) -> bool:
        return not (self.start or self.replace or self.stop)


def slot_specs(
    workers: Mapping[str, WorkerConfig], *, python: str, base_dir: Path | None
) -> dict[SlotKey, LaunchSpec]:
    """Every slot of ``workers`` with its spec, in entry then replica order."""
    return {
        (name, index): launch_spec(name, config, index, python=python, base_dir=base_dir)
        for name, config in workers.items()
        for index in range(config.replicas)
    }


def plan(old: Mapping[SlotKey, LaunchSpec], new: Mapping[SlotKey, LaunchSpec]) -> Plan:
    """The moves from ``old`` to ``new`` (each list in ``new``'s order, then ``old``'s)."""
    result = Plan()
    for key, spec in new.items():
        if key not in old:
            result.start.append(key)
        elif old[key] == spec:
            result.keep.append(key)
        else:
            result.replace.append(key)
    result.stop.extend(key for key in old if key not in new)
    return result
