"""Evaluate an engine mapping's sources against the samples of one ``/metrics`` page (pure).

``index_samples(families)`` files samples by name. A counter's samples are filed under the
name with and without a ``_total`` suffix: the Prometheus parser appends ``_total`` to a typed
counter whose name lacks it (llama.cpp's ``llamacpp:n_tokens_max``, TGI's ``tgi_request_count``),
while a page cut to a few lines (comments dropped, so untyped) keeps the name as written;
filing both makes the full page and the cut page read alike.

``signal_value`` returns ``None`` for "not on the page"; deciding whether that is an error is
the caller's (``local_tier.vllm.metrics``), which knows which signals are required.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from local_tier.engines.spec import Histogram, InfoLabel, Ratio, Series, Signal, Source

Index = Mapping[str, Sequence[Sample]]


def index_samples(families: Iterable[Metric]) -> dict[str, list[Sample]]:
    """Samples by sample name, in page order (counters also by their name without
    ``_total``). Raises what the parser raises (``ValueError`` for malformed text)."""
    by_name: dict[str, list[Sample]] = {}
    for family in families:
        counter = family.type == "counter"
        for sample in family.samples:
            by_name.setdefault(sample.name, []).append(sample)
            if counter and sample.name.endswith("_total"):
                by_name.setdefault(sample.name.removesuffix("_total"), []).append(sample)
    return by_name


def _matches(sample: Sample, where: tuple[tuple[str, str], ...]) -> bool:
    return all(sample.labels.get(label) == value for label, value in where)


def fold_series(index: Index, series: Series) -> float | None:
    """The series folded over its matching label sets; ``None`` when no sample matches."""
    samples = [s for s in index.get(series.name, ()) if _matches(s, series.where)]
    if not samples:
        return None
    groups: dict[tuple[tuple[str, str], ...], float] = {}
    for sample in samples:
        key = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in series.copies))
        seen = groups.get(key)
        groups[key] = sample.value if seen is None else max(seen, sample.value)
    values = groups.values()
    total = sum(values) if series.fold == "sum" else max(values)
    return float(total) * series.scale


def _info_label(index: Index, source: InfoLabel) -> float | None:
    for sample in index.get(source.name, ()):
        raw = sample.labels.get(source.label)
        if raw is not None and raw.isdigit():
            return float(raw)
    return None


def source_value(index: Index, source: Source) -> float | None:
    """One source's value on the page, ``None`` when absent."""
    if isinstance(source, Series):
        return fold_series(index, source)
    if isinstance(source, Ratio):
        used, total = fold_series(index, source.used), fold_series(index, source.total)
        if used is None or total is None or total <= 0:
            return None
        return used / total
    return _info_label(index, source)


def signal_value(index: Index, signal: Signal) -> float | None:
    """The first present source's value; 0 when none is but ``zero_if_present`` is on the
    page (a lazily created gauge never set); else ``None``."""
    for source in signal.sources:
        value = source_value(index, source)
        if value is not None:
            return value
    if signal.zero_if_present is not None and index.get(signal.zero_if_present):
        return 0.0
    return None


def histogram_totals(index: Index, histogram: Histogram) -> tuple[float, float] | None:
    """(sum in seconds, count) over the matching label sets; ``None`` when either is absent."""
    sums = [s.value for s in index.get(histogram.sum_name, ()) if _matches(s, histogram.where)]
    counts = [s.value for s in index.get(histogram.count_name, ()) if _matches(s, histogram.where)]
    if not sums or not counts:
        return None
    return float(sum(sums)) * histogram.scale, float(sum(counts))
