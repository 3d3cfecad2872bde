"""A discovered provider in the runtime snapshot: one provider per address, one target per
replica (its own label, so breakers, latency, saturation and the prefix index are per
replica), skipped with a reason when no address is known, carried over across rebuilds."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pytest

from core.clock import FakeClock
from core.config import Config, parse_config
from gateway.process.runtime import Runtime, Stores
from gateway.process.state import local_replicas, target_labels
from policies.store import MemoryStore
from providers.transport import make_client

CONFIG = """
providers:
  pool:
    type: vllm
    base_url: "http://workers.svc:8000/v1"
    discovery: {nameservers: ["127.0.0.1:5353"]}
  single: {type: vllm, base_url: "http://10.1.1.1:8000/v1"}
models:
  m:
    strategy: weighted
    targets:
      - {provider: pool, model: m-local, weight: 3}
      - {provider: single, model: m-local, weight: 1}
"""


@pytest.fixture
def config() -> Config:
    return parse_config(CONFIG)


@pytest.fixture
def stores() -> Iterator[Stores]:
    memory = MemoryStore(FakeClock())
    yield Stores(shared=memory, local=memory)


def build(
    config: Config,
    stores: Stores,
    replicas: Mapping[str, Sequence[str]] | None,
    previous: Runtime | None = None,
) -> Runtime:
    return Runtime(config, make_client(), {}, previous=previous, stores=stores, replicas=replicas)


def test_each_address_is_a_provider_and_each_target_a_replica(
    config: Config, stores: Stores
) -> None:
    runtime = build(config, stores, {"workers.svc": ["10.0.0.2", "fd00::3"]})
    assert sorted(runtime.providers) == ["pool@10.0.0.2", "pool@fd00::3", "single"]
    targets, skipped = runtime.plan_for("m")
    assert skipped == []
    assert [t.label for t in targets] == [
        "pool@10.0.0.2/m-local",
        "pool@fd00::3/m-local",
        "single/m-local",
    ]
    # the provider's name stays the configured one (tenant provider lists, headers)
    assert [t.provider_name for t in targets] == ["pool", "pool", "single"]
    # the target's weight is shared by its replicas: pool still gets 3 of 4 shares
    assert [t.weight for t in targets] == [1.5, 1.5, 1.0]
    assert target_labels(runtime) == [t.label for t in targets]
    specs = local_replicas(runtime)
    assert specs["pool@10.0.0.2/m-local"].metrics_url == "http://10.0.0.2:8000/metrics"
    assert specs["pool@fd00::3/m-local"].metrics_url == "http://[fd00::3]:8000/metrics"
    assert specs["single/m-local"].metrics_url == "http://10.1.1.1:8000/metrics"


def test_no_address_skips_the_provider_targets_with_a_reason(
    config: Config, stores: Stores
) -> None:
    runtime = build(config, stores, None)
    assert runtime.replicas == {"workers.svc": ()}
    targets, skipped = runtime.plan_for("m")
    assert [t.label for t in targets] == ["single/m-local"]
    assert [s.label for s in skipped] == ["pool/m-local"]
    assert skipped[0].reason == "no replicas: DNS name workers.svc has no known address (discovery)"
    assert "pool/m-local" not in local_replicas(runtime)


def test_a_rebuild_carries_unchanged_replicas_and_retires_dropped_ones(
    config: Config, stores: Stores
) -> None:
    first = build(config, stores, {"workers.svc": ["10.0.0.2", "10.0.0.3"]})
    second = build(config, stores, {"workers.svc": ["10.0.0.3", "10.0.0.4"]}, previous=first)
    assert second.providers["pool@10.0.0.3"] is first.providers["pool@10.0.0.3"]
    assert second.providers["single"] is first.providers["single"]
    assert second.retired == [first.providers["pool@10.0.0.2"]]
    assert "pool@10.0.0.4" in second.providers


def test_a_reload_keeps_the_known_addresses(config: Config, stores: Stores) -> None:
    first = build(config, stores, {"workers.svc": ["10.0.0.2"], "gone.svc": ["10.9.9.9"]})
    reloaded = build(config, stores, None, previous=first)  # a reload passes no replicas
    assert reloaded.replicas == {"workers.svc": ("10.0.0.2",)}  # only names still used
    assert reloaded.providers["pool@10.0.0.2"] is first.providers["pool@10.0.0.2"]
    assert reloaded.retired == []


def test_a_changed_provider_setting_rebuilds_its_replicas(config: Config, stores: Stores) -> None:
    first = build(config, stores, {"workers.svc": ["10.0.0.2"]})
    changed = parse_config(
        CONFIG.replace(
            'base_url: "http://workers.svc:8000/v1"', 'base_url: "http://workers.svc:9000/v1"'
        )
    )
    second = build(changed, stores, None, previous=first)
    provider = second.providers["pool@10.0.0.2"]
    assert provider is not first.providers["pool@10.0.0.2"]
    assert second.retired == [first.providers["pool@10.0.0.2"]]
    assert local_replicas(second)["pool@10.0.0.2/m-local"].metrics_url == (
        "http://10.0.0.2:9000/metrics"
    )
