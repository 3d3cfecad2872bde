"""Worker discovery by DNS over real HTTP: a real DNS server on loopback (dnslib) whose
answers the tests change, three fake vLLM replicas (real HTTP servers with a ``/metrics``
page) and an in-process gateway whose ``type: vllm`` provider names a DNS name.

The replicas listen on 127.0.0.2, .3 and .4 (Linux routes all of 127/8 to ``lo``) on one
port, so the DNS answer carries only addresses, as a headless Service's does. The OpenAI SDK
is the client; ``round_robin`` spreads requests so each replica's share is exact.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from tests.fixtures.dns_server import DnsServer, dns_server
from tests.fixtures.fake_replica import Replica
from tests.integration.gateway_harness import Gateway, running_gateway

ADMIN = "sy-admin-discovery-0123456789abcdef"
NAME = "workers.ns.svc.cluster.local"
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


def label(host: str) -> str:
    return f"pool@{host}/m-local"


# ---------------------------------------------------------------------- the replicas
@dataclass
class Fleet:
    port: int
    replicas: dict[str, Replica]

    def calls(self) -> dict[str, int]:
        return {host: replica.calls() for host, replica in self.replicas.items()}


def _common_free_port() -> int:
    """A TCP port free on every replica address (held together while checked)."""
    for _ in range(50):
        with ExitStack() as held:
            first = held.enter_context(socket.socket())
            first.bind((HOSTS[0], 0))
            port = int(first.getsockname()[1])
            try:
                for host in HOSTS[1:]:
                    held.enter_context(socket.socket()).bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError("no port free on every replica address")


@contextmanager
def _serve_at(app: Any, host: str, port: int) -> Iterator[None]:
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"replica on {host}:{port} did not start")
        time.sleep(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    port = _common_free_port()
    replicas = {host: Replica() for host in HOSTS}
    with ExitStack() as running:
        for host, replica in replicas.items():
            running.enter_context(_serve_at(replica, host, port))
        yield Fleet(port, replicas)


@pytest.fixture
def dns(fleet: Fleet) -> Iterator[DnsServer]:
    for replica in fleet.replicas.values():
        replica.busy = False
    with dns_server() as server:
        yield server


# ---------------------------------------------------------------------- the gateway
@contextmanager
def gateway(fleet: Fleet, dns: DnsServer) -> Iterator[Gateway]:
    config = f"""
auth: {{admin_key_env: T_ADMIN}}
server: {{drain_timeout_s: 0.5}}
providers:
  pool:
    type: vllm
    base_url: "http://{NAME}:{fleet.port}/v1"
    saturation: {{poll_interval_s: 0.05, max_waiting: 0, stale_after_s: 2}}
    discovery:
      interval_s: 0.1
      timeout_s: 0.5
      empty_after: 2
      nameservers: ["{dns.nameserver}"]
models:
  m: {{strategy: round_robin, targets: [{{provider: pool, model: m-local}}]}}
  slow: {{targets: [{{provider: pool, model: m-slow}}]}}
"""
    with running_gateway(config, {"T_ADMIN": ADMIN}) as running:
        yield running


def admin_targets(gw: Gateway) -> dict[str, Any]:
    answer = httpx.get(
        gw.url + "/admin/targets", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def targets(gw: Gateway) -> dict[str, dict[str, Any]]:
    """The targets of alias ``m`` (``slow`` has one more per replica)."""
    return {t["target"]: t for t in admin_targets(gw)["targets"] if "m" in t["aliases"]}


def chat(gw: Gateway, model: str = "m") -> Any:
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hello"}]
    )
    assert raw.headers["x-switchyard-provider"] == "pool"
    return raw.parse()


def eventually(condition: Callable[[], bool], limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def served(fleet: Fleet, gw: Gateway, count: int) -> dict[str, int]:
    """Send ``count`` chats; how many each replica received."""
    before = fleet.calls()
    for _ in range(count):
        assert chat(gw).choices[0].message.content == "Hello from openai!"
    after = fleet.calls()
    return {host: after[host] - before[host] for host in HOSTS}


def ready(gw: Gateway, *hosts: str) -> bool:
    """The gateway serves exactly ``hosts``, each polled and not saturated."""
    found = targets(gw)
    return set(found) == {label(h) for h in hosts} and not any(
        t["saturated"] for t in found.values()
    )


# ---------------------------------------------------------------------- the tests
def test_the_gateway_starts_with_the_replicas_its_name_has(fleet: Fleet, dns: DnsServer) -> None:
    dns.zone.set(NAME, [HOSTS[0]])
    with gateway(fleet, dns) as gw:
        assert set(targets(gw)) == {label(HOSTS[0])}  # resolved during startup
        eventually(lambda: ready(gw, HOSTS[0]))
        assert served(fleet, gw, 2) == {HOSTS[0]: 2, HOSTS[1]: 0, HOSTS[2]: 0}


def test_a_grown_answer_adds_a_replica_with_its_own_saturation(
    fleet: Fleet, dns: DnsServer
) -> None:
    dns.zone.set(NAME, [HOSTS[0]])
    with gateway(fleet, dns) as gw:
        dns.zone.set(NAME, [HOSTS[0], HOSTS[1]])
        eventually(lambda: ready(gw, HOSTS[0], HOSTS[1]))
        assert served(fleet, gw, 6) == {HOSTS[0]: 3, HOSTS[1]: 3, HOSTS[2]: 0}
        page = httpx.get(gw.url + "/metrics", timeout=10).text
        for host in HOSTS[:2]:
            assert f'switchyard_replica_saturated{{target="{label(host)}"}} 0.0' in page

        fleet.replicas[HOSTS[1]].busy = True  # its /metrics now shows 3 waiting
        eventually(lambda: targets(gw)[label(HOSTS[1])]["saturated"])
        found = targets(gw)
        assert found[label(HOSTS[1])]["waiting"] >= 3
        assert not found[label(HOSTS[0])]["saturated"]
        assert found[label(HOSTS[0])]["waiting"] == 0
        assert served(fleet, gw, 4) == {HOSTS[0]: 4, HOSTS[1]: 0, HOSTS[2]: 0}


def test_a_shrunk_answer_retires_the_replica(fleet: Fleet, dns: DnsServer) -> None:
    dns.zone.set(NAME, [HOSTS[1], HOSTS[2]])
    with gateway(fleet, dns) as gw:
        eventually(lambda: ready(gw, HOSTS[1], HOSTS[2]))
        state = gw.app.state.gateway
        leaving = state.runtime.providers[f"pool@{HOSTS[2]}"]
        dns.zone.set(NAME, [HOSTS[1]])
        eventually(lambda: set(targets(gw)) == {label(HOSTS[1])})
        assert f"pool@{HOSTS[2]}" not in state.runtime.providers
        assert state.runtime.retired == [leaving]  # closed once the drain timeout passed
        assert label(HOSTS[2]) not in state.trackers.capacity.labels()  # no longer polled
        assert served(fleet, gw, 4) == {HOSTS[0]: 0, HOSTS[1]: 4, HOSTS[2]: 0}


def test_a_request_in_flight_on_a_removed_replica_finishes_there(
    fleet: Fleet, dns: DnsServer
) -> None:
    dns.zone.set(NAME, [HOSTS[2]])
    with gateway(fleet, dns) as gw, ThreadPoolExecutor(max_workers=1) as pool:
        eventually(lambda: ready(gw, HOSTS[2]))
        before = fleet.calls()[HOSTS[2]]
        fleet.replicas[HOSTS[2]].chat.slow_seconds = 1.5
        pending = pool.submit(chat, gw, "slow")  # the replica answers m-slow after 1.5 s
        eventually(lambda: fleet.calls()[HOSTS[2]] == before + 1)
        dns.zone.set(NAME, [HOSTS[0]])
        eventually(lambda: set(targets(gw)) == {label(HOSTS[0])})
        assert not pending.done()  # still on the replica the gateway no longer routes to
        assert pending.result(timeout=30).choices[0].message.content == "Hello from openai!"
        assert served(fleet, gw, 2) == {HOSTS[0]: 2, HOSTS[1]: 0, HOSTS[2]: 0}


def test_a_resolver_outage_keeps_the_last_known_replicas(fleet: Fleet, dns: DnsServer) -> None:
    dns.zone.set(NAME, [HOSTS[0], HOSTS[2]])
    with gateway(fleet, dns) as gw:
        eventually(lambda: ready(gw, HOSTS[0], HOSTS[2]))
        dns.stop()
        discovery = gw.app.state.gateway.discovery
        eventually(lambda: discovery.status()[NAME]["failures"] >= 2)
        assert set(targets(gw)) == {label(HOSTS[0]), label(HOSTS[2])}
        assert served(fleet, gw, 4) == {HOSTS[0]: 2, HOSTS[1]: 0, HOSTS[2]: 2}


def test_a_name_without_addresses_answers_503_until_replicas_appear(
    fleet: Fleet, dns: DnsServer
) -> None:
    """NXDOMAIN at start: the gateway starts without replicas and says why; replicas that
    appear serve; once the name is gone for ``empty_after`` answers, 503 again."""
    with gateway(fleet, dns) as gw:
        assert targets(gw) == {}
        reason = "no replicas: DNS name workers.ns.svc.cluster.local has no known address"
        (skipped,) = admin_targets(gw)["skipped"]["m"]
        assert skipped["label"] == "pool/m-local"
        assert reason in skipped["reason"]
        refused(gw, reason)

        dns.zone.set(NAME, [HOSTS[2]])
        eventually(lambda: ready(gw, HOSTS[2]))
        assert served(fleet, gw, 2) == {HOSTS[0]: 0, HOSTS[1]: 0, HOSTS[2]: 2}

        dns.zone.remove(NAME)
        eventually(lambda: targets(gw) == {})
        refused(gw, reason)


def refused(gw: Gateway, reason: str) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        chat(gw)
    assert caught.value.status_code == 503
    error = caught.value.response.json()["error"]
    assert error["code"] == "no_target_available"
    assert reason in error["message"]
