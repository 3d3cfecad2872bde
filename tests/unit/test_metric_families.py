"""The event-loop counters and histograms expose what prometheus_client's own would."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry.families import Families

BOUNDS = (0.1, 0.5, 1.0)


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_a_counter_is_exposed_with_total_per_label_set():
    registry = CollectorRegistry()
    requests = Families(registry).counter("x_requests", "Requests.", ["route"])
    requests.labels("a").inc()
    requests.labels("a").inc(2.5)
    requests.labels("b").inc()
    assert registry.get_sample_value("x_requests_total", {"route": "a"}) == 3.5
    assert registry.get_sample_value("x_requests_total", {"route": "b"}) == 1.0


@given(st.lists(st.sampled_from([0.0, 0.05, 0.1, 0.3, 0.5, 0.7, 1.0, 2.0, 50.0]), max_size=40))
def test_a_histogram_matches_prometheus_client_s_own(values: list[float]):
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = Families(ours).histogram("x_seconds", "Seconds.", ["k"], BOUNDS)
    reference = Histogram("x_seconds", "Seconds.", ["k"], registry=theirs, buckets=BOUNDS)
    for value in values:
        mine.labels("v").observe(value)
        reference.labels("v").observe(value)
    assert samples(ours) == samples(theirs)  # buckets (le on a bound), +Inf, count, sum
