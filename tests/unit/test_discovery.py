"""Worker discovery's pure parts: replica URLs and names, address diffs, the address book's
rules (last good answer kept on failures, empty only after N empty answers), the config."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from core.config import ConfigError, VllmProviderConfig, parse_config
from core.config_discovery import DiscoveryConfig, parse_nameserver
from local_tier.discovery import (
    AddressBook,
    Empty,
    Failed,
    Found,
    diff,
    discovered_names,
    dns_name,
    ordered,
    replica_config,
    replica_name,
    replica_url,
)

ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).map(str)
addresses = st.one_of(ipv4, ipv6)
address_sets = st.frozensets(addresses, max_size=6)


# ---------------------------------------------------------------------- URLs and names
@pytest.mark.parametrize(
    ("url", "address", "expected"),
    [
        ("http://vllm.svc:8000/v1", "10.0.0.7", "http://10.0.0.7:8000/v1"),
        ("http://vllm.svc:8000/v1", "fd00::7", "http://[fd00::7]:8000/v1"),
        ("https://vllm.svc/v1", "10.0.0.7", "https://10.0.0.7/v1"),
        ("http://vllm.svc:9000/metrics?x=1", "10.0.0.7", "http://10.0.0.7:9000/metrics?x=1"),
        ("http://u:p@vllm.svc:8000/v1", "fd00::1", "http://u:p@[fd00::1]:8000/v1"),
    ],
)
def test_replica_url_puts_the_address_in_place_of_the_host(
    url: str, address: str, expected: str
) -> None:
    assert replica_url(url, address) == expected


@given(
    address=addresses,
    port=st.one_of(st.none(), st.integers(1, 65535)),
    path=st.sampled_from(["", "/v1", "/a/b/"]),
)
def test_replica_url_keeps_scheme_port_and_path(address: str, port: int | None, path: str) -> None:
    url = f"http://workers.ns.svc.cluster.local{'' if port is None else f':{port}'}{path}"
    parts = urlsplit(replica_url(url, address))
    assert parts.hostname is not None
    assert ipaddress.ip_address(parts.hostname) == ipaddress.ip_address(address)
    assert (parts.scheme, parts.port, parts.path) == ("http", port, path)


def test_replica_names_and_configs() -> None:
    config = VllmProviderConfig(
        base_url="http://workers.svc:8000/v1",
        metrics_url="http://workers.svc:8001/metrics",
        discovery=DiscoveryConfig(),
    )
    assert dns_name(config) == "workers.svc"
    assert replica_name("pool", "10.0.0.7") == "pool@10.0.0.7"
    assert replica_name("pool", "fd00::7") == "pool@fd00::7"
    replica = replica_config(config, "fd00::7")
    assert replica.base_url == "http://[fd00::7]:8000/v1"
    assert replica.metrics_url == "http://[fd00::7]:8001/metrics"
    assert replica.discovery is None  # a plain replica: polled and called like any worker
    assert replica.saturation == config.saturation
    assert (
        replica_config(VllmProviderConfig(base_url=config.base_url), "10.0.0.1").metrics_url is None
    )


def test_discovered_names_are_the_hosts_of_providers_with_discovery() -> None:
    config = parse_config(
        """
providers:
  a: {type: vllm, base_url: "http://pool-a.svc:8000/v1", discovery: {interval_s: 1}}
  b: {type: vllm, base_url: "http://pool-b.svc:8000/v1", discovery: {}}
  c: {type: vllm, base_url: "http://pool-c.svc:8000/v1"}
  d: {type: openai, base_url: "http://pool-d.svc/v1"}
"""
    )
    names = discovered_names(config)
    assert sorted(names) == ["pool-a.svc", "pool-b.svc"]
    assert names["pool-a.svc"].interval_s == 1


def test_ordered_normalises_and_sorts_ipv4_before_ipv6() -> None:
    got = ordered(["fd00:0:0::2", "10.0.0.10", "10.0.0.9", "fd00::1", "10.0.0.9"])
    assert got == ("10.0.0.9", "10.0.0.10", "fd00::1", "fd00::2")


# ---------------------------------------------------------------------- diffs
@given(old=address_sets, new=address_sets)
def test_a_diff_takes_old_to_new(old: frozenset[str], new: frozenset[str]) -> None:
    change = diff("n", old, new)
    if old == new:
        assert change is None
        return
    assert change is not None
    assert (set(old) - set(change.removed)) | set(change.added) == set(new)
    assert not set(change.added) & set(change.removed)


# ---------------------------------------------------------------------- the address book
def book(empty_after: int = 3) -> tuple[AddressBook, FakeClock]:
    clock = FakeClock()
    return AddressBook("workers.svc", clock, empty_after), clock


def test_an_answer_replaces_the_set_and_says_what_moved() -> None:
    addresses, clock = book()
    first = addresses.take(Found(("10.0.0.2",)))
    assert first is not None and (first.added, first.removed) == (("10.0.0.2",), ())
    clock.advance(5)
    second = addresses.take(Found(("10.0.0.3", "10.0.0.2")))
    assert second is not None and (second.added, second.removed) == (("10.0.0.3",), ())
    third = addresses.take(Found(("10.0.0.3",)))
    assert third is not None and (third.added, third.removed) == ((), ("10.0.0.2",))
    assert addresses.take(Found(("10.0.0.3",))) is None
    assert addresses.addresses == ("10.0.0.3",)
    assert addresses.status()["age_s"] == 0


@given(known=st.frozensets(addresses, min_size=1, max_size=4), failures=st.integers(1, 50))
def test_failed_lookups_never_drop_replicas(known: frozenset[str], failures: int) -> None:
    addresses, clock = book(empty_after=1)
    addresses.take(Found(tuple(known)))
    for _ in range(failures):
        clock.advance(5)
        assert addresses.take(Failed("timeout")) is None
    assert addresses.addresses == ordered(known)
    status = addresses.status()
    assert status["failures"] == failures
    assert status["last_error"] == "timeout"
    assert status["age_s"] == failures * 5  # the last answer is this old


def test_empty_answers_empty_the_set_only_at_the_nth_in_a_row() -> None:
    addresses, _ = book(empty_after=3)
    addresses.take(Found(("10.0.0.2", "10.0.0.3")))
    assert addresses.take(Empty("NXDOMAIN")) is None
    assert addresses.take(Failed("timeout")) is None  # not an answer: the streak goes on
    assert addresses.take(Empty("NXDOMAIN")) is None
    assert addresses.addresses == ("10.0.0.2", "10.0.0.3")
    change = addresses.take(Empty("NXDOMAIN"))
    assert change is not None and change.removed == ("10.0.0.2", "10.0.0.3")
    assert addresses.addresses == ()


def test_an_answer_with_addresses_ends_an_empty_streak() -> None:
    addresses, _ = book(empty_after=2)
    addresses.take(Found(("10.0.0.2",)))
    addresses.take(Empty("NXDOMAIN"))
    addresses.take(Found(("10.0.0.2",)))
    assert addresses.take(Empty("NXDOMAIN")) is None  # one empty again, not two
    assert addresses.addresses == ("10.0.0.2",)


# ---------------------------------------------------------------------- the config
DISCOVERED = 'providers: {{w: {{type: vllm, base_url: "{url}", discovery: {discovery}}}}}'


def errors(url: str, discovery: str = "{}", extra: str = "") -> list[str]:
    text = DISCOVERED.format(url=url, discovery=discovery)
    if extra:
        text = text.replace("discovery:", f"{extra}, discovery:")
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    return caught.value.errors


def test_the_config_takes_a_discovery_block() -> None:
    config = parse_config(
        DISCOVERED.format(
            url="http://workers.ns.svc.cluster.local:8000/v1",
            discovery='{interval_s: 2, nameservers: ["127.0.0.1:5353", "[::1]:53", "10.96.0.10"]}',
        )
    )
    provider = config.providers["w"]
    assert isinstance(provider, VllmProviderConfig) and provider.discovery is not None
    assert provider.discovery.mode == "dns"
    assert provider.discovery.nameserver_addresses() == [
        ("127.0.0.1", 5353),
        ("::1", 53),
        ("10.96.0.10", 53),
    ]


@pytest.mark.parametrize(
    ("url", "discovery", "extra", "message"),
    [
        (
            "http://10.0.0.1:8000/v1",
            "{}",
            "",
            "providers.w: discovery needs a DNS name in base_url, not the IP address 10.0.0.1",
        ),
        ("http://[fd00::1]:8000/v1", "{}", "", "not the IP address fd00::1"),
        ("http://w.svc/v1", "{interval_s: 0}", "", "providers.w.discovery.interval_s: Expected"),
        ("http://w.svc/v1", "{empty_after: 0}", "", "providers.w.discovery.empty_after"),
        ("http://w.svc/v1", "{mode: srv}", "", "providers.w.discovery.mode: Invalid enum"),
        (
            "http://w.svc/v1",
            '{nameservers: ["dns.example"]}',
            "",
            "providers.w.discovery: nameserver 'dns.example' is not an IP address",
        ),
        ("http://w.svc/v1", '{nameservers: ["10.0.0.1:99999"]}', "", "no valid port"),
        ("http://w.svc/v1", '{nameservers: ["[::1]x"]}', "", "no valid port"),
        (
            "http://w.svc/v1",
            "{}",
            'metrics_url: "http://other.svc/metrics"',
            "metrics_url must name the same host as base_url (w.svc)",
        ),
        ("unix:///tmp/socket", "{}", "", "discovery needs a host name in base_url"),
    ],
)
def test_nonsense_discovery_config_is_rejected_with_its_key_path(
    url: str, discovery: str, extra: str, message: str
) -> None:
    found = errors(url, discovery, extra)
    assert len(found) == 1
    assert message in found[0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.0.0.1", ("10.0.0.1", 53)),
        ("10.0.0.1:5353", ("10.0.0.1", 5353)),
        ("fd00::1", ("fd00::1", 53)),
        ("[fd00:0::1]:5353", ("fd00::1", 5353)),
        ("[fd00::1]", ("fd00::1", 53)),
    ],
)
def test_nameservers_are_addresses_with_optional_ports(
    text: str, expected: tuple[str, int]
) -> None:
    assert parse_nameserver(text) == expected
