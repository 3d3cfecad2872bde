"""The ``discovery:`` block of a ``type: vllm`` provider: the host in its ``base_url`` is a DNS
name (a Kubernetes headless Service) whose A/AAAA records are the replicas; the gateway
re-resolves it every ``interval_s`` (docs/local_tier_vllm.md, *Worker discovery by DNS*)."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal
from urllib.parse import urlsplit

from msgspec import Meta, Struct

PositiveFloat = Annotated[float, Meta(gt=0)]
PositiveInt = Annotated[int, Meta(ge=1)]
DNS_PORT = 53


class DiscoveryConfig(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """How to find a provider's replicas. ``nameservers`` empty: the system resolver
    (``/etc/resolv.conf``, its search list included; ``/etc/hosts`` is not read)."""

    mode: Literal["dns"] = "dns"
    interval_s: PositiveFloat = 5.0  # re-resolve this often
    timeout_s: PositiveFloat = 2.0  # one lookup (A and AAAA together)
    nameservers: list[str] = []  # "10.96.0.10", "127.0.0.1:5353", "[fd00::a]:53"
    # Consecutive empty answers (NXDOMAIN, or no A/AAAA record) before the replica set
    # becomes empty; a failed lookup (timeout, SERVFAIL, refused) never empties it.
    empty_after: PositiveInt = 3

    def __post_init__(self) -> None:
        for text in self.nameservers:
            parse_nameserver(text)  # ValueError names the bad entry

    def nameserver_addresses(self) -> list[tuple[str, int]]:
        """``nameservers`` as (IP address, port) pairs."""
        return [parse_nameserver(text) for text in self.nameservers]


def parse_nameserver(text: str) -> tuple[str, int]:
    """``"10.0.0.1"``, ``"10.0.0.1:5353"``, ``"fd00::1"`` or ``"[fd00::1]:5353"`` -> (address,
    port). ValueError for anything else (a DNS server is named by its address, not a name)."""
    host, port = text, DNS_PORT
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            port = _port(text, rest[1:] if rest.startswith(":") else "")
    elif text.count(":") == 1:
        host, _, tail = text.partition(":")
        port = _port(text, tail)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            f"nameserver '{text}' is not an IP address with an optional port"
        ) from None
    return address.compressed, port


def _port(text: str, digits: str) -> int:
    if not digits.isdigit() or not 1 <= int(digits) <= 65535:
        raise ValueError(f"nameserver '{text}' has no valid port (1-65535)")
    return int(digits)


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def discovery_problem(base_url: str, metrics_url: str | None) -> str | None:
    """Why these URLs cannot be used with discovery, or None: the base_url's host must be a
    DNS name, and an explicit ``metrics_url`` must name the same host (each replica's
    metrics are read at its own address)."""
    host = urlsplit(base_url).hostname
    if not host:
        return f"discovery needs a host name in base_url, got '{base_url}'"
    if is_ip_literal(host):
        return f"discovery needs a DNS name in base_url, not the IP address {host}"
    if metrics_url is not None and urlsplit(metrics_url).hostname != host:
        return f"with discovery, metrics_url must name the same host as base_url ({host})"
    return None
