"""How a serving engine names its load on its Prometheus ``/metrics`` page, as data.

An ``EngineMapping`` says, for each number a ``MetricsSnapshot`` holds, where that engine puts
it: a ``Signal`` lists sources tried in order (an engine's current names first, the names of
its older releases after), and the first source present on the page gives the value. A source
is one of:

- ``Series``: the samples of one name, optionally only those carrying given label values
  (Triton's ``request_type="waiting"``), folded over their label sets into one number: summed
  (data-parallel engines and served models add up) or their maximum (fractions), with labels
  that only index copies of one number (SGLang's ``tp_rank``) counted once;
- ``Ratio``: one folded series over another (TensorRT-LLM's used / max KV blocks);
- ``InfoLabel``: an integer carried as a label of an info series (vLLM's ``cache_config_info``).

Whether a signal may be absent is part of the mapping: ``running`` and ``waiting`` are always
required, KV use is required where the engine always exports it, and an engine that exports no
KV signal says so (``kv_usage`` ``None`` or not ``required``) and lists what it leaves unknown in
``notes``. Nothing here reads pages; ``local_tier.engines.read`` evaluates these against one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Fold = Literal["sum", "max"]


@dataclass(frozen=True, slots=True)
class Series:
    """Samples named ``name`` (spelt as on the page, counters' ``_total`` included when the
    engine writes it) whose labels include every pair in ``where``, folded into one number.

    Samples that differ only in the ``copies`` labels report one number several times (every
    tensor-parallel rank of one SGLang scheduler, say): they count once, by their maximum.
    The remaining groups are folded by ``fold``: ``sum`` for counts and counters, ``max`` for
    fractions. ``scale`` multiplies the result (a unit conversion)."""

    name: str
    where: tuple[tuple[str, str], ...] = ()
    copies: tuple[str, ...] = ()
    fold: Fold = "sum"
    scale: float = 1.0


@dataclass(frozen=True, slots=True)
class Ratio:
    """``used / total``, each folded as its ``Series`` says; absent when either is absent or
    ``total`` is not positive."""

    used: Series
    total: Series


@dataclass(frozen=True, slots=True)
class InfoLabel:
    """An integer label (``label``) of an info series ``name`` whose value is always 1 and whose
    data sits in labels; the first sample carrying a decimal value for it."""

    name: str
    label: str


Source = Series | Ratio | InfoLabel


@dataclass(frozen=True, slots=True)
class Signal:
    """Where one number is read: ``sources`` in order of preference, the first present wins.

    ``required``: a page without any source is not this engine's page (or not a working one),
    and parsing fails rather than reading the replica as idle.

    ``zero_if_present``: the engine creates this gauge lazily, when it first changes (TGI's
    exporter renders a gauge only once it has been set). When no source is on the page but
    the series named here is, the engine is up and exporting and the value is 0."""

    sources: tuple[Source, ...]
    required: bool = False
    zero_if_present: str | None = None

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("a signal needs at least one source")

    def primary_name(self) -> str:
        """The first source's series name (for messages)."""
        first = self.sources[0]
        return first.used.name if isinstance(first, Ratio) else first.name

    def names(self) -> frozenset[str]:
        """Every sample name this signal may read."""
        out: set[str] = set()
        for source in self.sources:
            if isinstance(source, Ratio):
                out.update((source.used.name, source.total.name))
            else:
                out.add(source.name)
        if self.zero_if_present is not None:
            out.add(self.zero_if_present)
        return frozenset(out)


@dataclass(frozen=True, slots=True)
class Histogram:
    """A latency histogram (or summary) ``name``: its ``_sum`` and ``_count`` samples, summed
    over the label sets that carry every pair in ``where``; ``scale`` converts the sum to
    seconds."""

    name: str
    where: tuple[tuple[str, str], ...] = ()
    scale: float = 1.0

    @property
    def sum_name(self) -> str:
        return f"{self.name}_sum"

    @property
    def count_name(self) -> str:
        return f"{self.name}_count"


@dataclass(frozen=True, slots=True)
class EngineMapping:
    """One engine's names for every signal of a ``MetricsSnapshot``.

    ``running`` / ``waiting``: requests in the running batch / queued (both required).
    ``kv_usage``: KV cache in use, 0-1 (``None``: the engine exports no such signal).
    ``prefix_queries`` / ``prefix_hits``: lifetime prompt tokens looked up in / found in the
    prefix cache (counters). ``block_size`` / ``num_blocks``: the KV pool's geometry;
    ``pool_tokens``: its size in tokens, for engines that state that directly. ``ttft``: the
    time-to-first-token histogram. ``notes``: what the engine does not export (or exports only
    approximately) and how the snapshot treats that, in words."""

    kind: str
    running: Signal
    waiting: Signal
    kv_usage: Signal | None
    prefix_queries: Signal | None = None
    prefix_hits: Signal | None = None
    block_size: Signal | None = None
    num_blocks: Signal | None = None
    pool_tokens: Signal | None = None
    ttft: Histogram | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (self.running.required and self.waiting.required):
            raise ValueError(f"{self.kind}: running and waiting must be required signals")

    def optional_signals(self) -> tuple[Signal, ...]:
        """The signals besides running, waiting and KV use, those the mapping has."""
        found = (
            self.prefix_queries,
            self.prefix_hits,
            self.block_size,
            self.num_blocks,
            self.pool_tokens,
        )
        return tuple(signal for signal in found if signal is not None)

    def snapshot_names(self) -> frozenset[str]:
        """Every sample name a snapshot may read (what a cut page keeps)."""
        signals = [self.running, self.waiting, *self.optional_signals()]
        if self.kv_usage is not None:
            signals.append(self.kv_usage)
        return frozenset().union(*(signal.names() for signal in signals))

    def ttft_names(self) -> frozenset[str]:
        """The TTFT histogram's ``_sum`` and ``_count`` names (empty without one)."""
        if self.ttft is None:
            return frozenset()
        return frozenset((self.ttft.sum_name, self.ttft.count_name))
