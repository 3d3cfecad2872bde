"""Counters and histograms for the event loop's thread: plain numbers, exposed through
prometheus_client at scrape time.

prometheus_client's own metrics take a lock and validate on every ``labels()``,
``inc()`` and ``observe()`` (its values must be safe to update from any thread). The
gateway updates its request series from one thread, the event loop's, and scrapes them
there too, so each update here is a dict lookup and an addition: the request series cost
a few microseconds per request instead of tens (docs/decisions/0011-observability.md).
Exposition, the text format and the registry stay prometheus_client's.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class HistogramChild:
    """Bucket counts (not cumulative; cumulated at scrape) and the sum."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound falls in that bound's bucket (le)
        self.counts[bisect_left(self._bounds, value)] += 1
        self.sum += value


class CounterFamily:
    """A named counter family with label names; ``labels(*values)`` is its child for
    those values (made on first use)."""

    def __init__(self, name: str, doc: str, labels: Sequence[str]) -> None:
        self.name, self.doc, self.label_names = name, doc, list(labels)
        self.children: dict[tuple[str, ...], CounterChild] = {}

    def labels(self, *values: str) -> CounterChild:
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = CounterChild()
        return child

    def metric(self) -> Metric:
        counter = CounterMetricFamily(self.name, self.doc, labels=self.label_names)
        for values, child in self.children.items():
            counter.add_metric(list(values), child.value)
        return counter


class HistogramFamily:
    """A named histogram family with label names and bucket bounds."""

    def __init__(
        self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> None:
        self.name, self.doc, self.label_names = name, doc, list(labels)
        self.buckets = tuple(sorted(buckets))
        self.children: dict[tuple[str, ...], HistogramChild] = {}

    def labels(self, *values: str) -> HistogramChild:
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = HistogramChild(self.buckets)
        return child

    def metric(self) -> Metric:
        histogram = HistogramMetricFamily(self.name, self.doc, labels=self.label_names)
        bounds = [*map(_bound, self.buckets), "+Inf"]
        for values, child in self.children.items():
            cumulative, running = [], 0
            for bound, count in zip(bounds, child.counts, strict=True):
                running += count
                cumulative.append((bound, float(running)))
            histogram.add_metric(list(values), cumulative, child.sum)
        return histogram


class Families(Collector):
    """The families of one registry, collected at scrape time."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._families: list[CounterFamily | HistogramFamily] = []
        registry.register(self)

    def counter(self, name: str, doc: str, labels: Sequence[str]) -> CounterFamily:
        family = CounterFamily(name, doc, labels)
        self._families.append(family)
        return family

    def histogram(
        self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> HistogramFamily:
        family = HistogramFamily(name, doc, labels, buckets)
        self._families.append(family)
        return family

    def collect(self) -> Iterator[Metric]:
        for family in self._families:
            yield family.metric()


def _bound(value: float) -> str:
    """A bucket bound as prometheus_client writes it (``0.005``, ``1.0``, ``1024.0``)."""
    return repr(float(value))
