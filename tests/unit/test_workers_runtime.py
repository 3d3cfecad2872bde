"""Ready workers in the runtime snapshot: one provider instance per worker address
(``pool@127.0.0.1:PORT``), one target per replica with its own metrics URL, the provider's
own settings kept; skipped with a reason while no worker is ready; and the addresses the
gateway asks its runtime to serve."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from core.clock import FakeClock
from core.config import Config, VllmProviderConfig, parse_config
from gateway.process.runtime import Runtime, Stores
from gateway.process.state import local_replicas
from gateway.process.workers import worker_replicas
from local_tier.workers import Supervisor
from local_tier.workers.lifecycle import State
from local_tier.workers.replicas import managed_key
from policies.store import MemoryStore
from providers.transport import make_client

CONFIG = """
providers:
  pool: {type: vllm, timeout_s: 30, saturation: {max_waiting: 2}}
  other: {type: vllm, base_url: "http://10.1.1.1:8000/v1"}
models:
  m: {targets: [{provider: pool, model: fake}, {provider: other, model: fake}]}
workers:
  a: {engine: command, command: [srv, "{port}"], provider: pool, port_range: [9000, 9001]}
  b: {engine: command, command: [srv, "{port}"], provider: pool, port_range: [9010, 9011]}
"""


@pytest.fixture
def config() -> Config:
    return parse_config(CONFIG)


@pytest.fixture
def stores() -> Iterator[Stores]:
    memory = MemoryStore(FakeClock())
    yield Stores(shared=memory, local=memory)


def test_each_ready_worker_is_a_replica_of_its_provider(config: Config, stores: Stores) -> None:
    addresses = ("127.0.0.1:9000", "127.0.0.1:9010")
    runtime = Runtime(
        config, make_client(), {}, stores=stores, replicas={managed_key("pool"): addresses}
    )
    assert sorted(runtime.providers) == ["other", "pool@127.0.0.1:9000", "pool@127.0.0.1:9010"]
    targets, skipped = runtime.plan_for("m")
    assert [t.label for t in targets] == [
        "pool@127.0.0.1:9000/fake",
        "pool@127.0.0.1:9010/fake",
        "other/fake",
    ]
    assert skipped == []
    replica = runtime.config_of(targets[1])
    assert isinstance(replica, VllmProviderConfig)
    assert replica.base_url == "http://127.0.0.1:9010/v1"
    assert (replica.timeout_s, replica.saturation.max_waiting) == (30.0, 2)
    specs = local_replicas(runtime)
    assert specs["pool@127.0.0.1:9000/fake"].metrics_url == "http://127.0.0.1:9000/metrics"


def test_no_ready_worker_skips_the_target_with_a_reason(config: Config, stores: Stores) -> None:
    runtime = Runtime(config, make_client(), {}, stores=stores)
    targets, skipped = runtime.plan_for("m")
    assert [t.label for t in targets] == ["other/fake"]
    assert skipped[0].label == "pool/fake"
    assert "none of its workers is ready" in skipped[0].reason
    assert runtime.replicas == {managed_key("pool"): ()}


def test_a_rebuild_keeps_replicas_it_is_not_told_about(config: Config, stores: Stores) -> None:
    first = Runtime(
        config,
        make_client(),
        {},
        stores=stores,
        replicas={managed_key("pool"): ("127.0.0.1:9000",)},
    )
    again = Runtime(config, make_client(), {}, previous=first, stores=stores)
    assert again.providers["pool@127.0.0.1:9000"] is first.providers["pool@127.0.0.1:9000"]


def test_the_gateway_asks_for_the_ready_workers_of_each_served_provider(config: Config) -> None:
    supervisor = Supervisor(FakeClock(), port_free=lambda port: True)
    supervisor.configure(config.workers)
    assert worker_replicas(supervisor, config) == {managed_key("pool"): ()}
    [a, b] = supervisor.replicas()
    a.record.launched(pid=1, port=9001, restart=False)
    a.record.move(State.READY)
    b.record.launched(pid=2, port=9010, restart=False)  # still starting: not served
    assert worker_replicas(supervisor, config) == {managed_key("pool"): ("127.0.0.1:9001",)}
