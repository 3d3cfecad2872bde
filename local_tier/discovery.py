"""Worker discovery by DNS: a ``type: vllm`` provider whose ``base_url`` host is a DNS name (a
Kubernetes headless Service: one A/AAAA record per ready pod) is served by one replica per
address. This module finds the addresses and keeps them; the gateway turns them into
providers and targets (gateway/process/runtime.py) and rebuilds its runtime when they change.

The rules (docs/local_tier_vllm.md, *Worker discovery by DNS*):

- An answer with addresses replaces the set at once (pods that turned ready join, pods that
  left are dropped).
- A failed lookup (timeout, SERVFAIL, refused, no reachable server) keeps the last known set,
  however long the outage lasts: a resolver hiccup never takes replicas away.
- An empty answer (NXDOMAIN, or no A/AAAA record) empties the set only when it is the
  ``empty_after``-th in a row: a headless Service with no ready pod answers NXDOMAIN, but so
  may a Service for a moment during a rollout.

Names: a replica's provider is ``<provider>@<address>`` and its target label
``<provider>@<address>/<model>`` (IPv6 addresses unbracketed: ``w@fd00::7/m``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.resolver
import msgspec
import structlog

from core.clock import Clock
from core.config import Config, VllmProviderConfig
from core.config_discovery import DiscoveryConfig

_log = structlog.get_logger("switchyard")
Addresses = tuple[str, ...]


# ---------------------------------------------------------------------- names and URLs
def replica_name(provider: str, address: str) -> str:
    """The provider name of one discovered replica: ``w@10.0.0.7``, ``w@fd00::7``."""
    return f"{provider}@{address}"


def replica_url(url: str, address: str) -> str:
    """``url`` with its host replaced by ``address`` (scheme, credentials, port, path and
    query kept); IPv6 addresses are bracketed."""
    parts = urlsplit(url)
    host = f"[{address}]" if ":" in address else address
    userinfo, _, _ = parts.netloc.rpartition("@")
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    if userinfo:
        netloc = f"{userinfo}@{netloc}"
    return urlunsplit(parts._replace(netloc=netloc))


def dns_name(config: VllmProviderConfig) -> str:
    """The DNS name a discovered provider's replicas are found under (base_url's host)."""
    return urlsplit(config.base_url).hostname or ""


def replica_config(config: VllmProviderConfig, address: str) -> VllmProviderConfig:
    """The plain (undiscovered) config of the replica at ``address``."""
    metrics = replica_url(config.metrics_url, address) if config.metrics_url else None
    return msgspec.structs.replace(
        config,
        base_url=replica_url(config.base_url, address),
        metrics_url=metrics,
        discovery=None,
    )


def discovered_names(config: Config) -> dict[str, DiscoveryConfig]:
    """Every DNS name the config's providers discover, with its settings (the first
    provider's when several name the same host)."""
    names: dict[str, DiscoveryConfig] = {}
    for provider in config.providers.values():
        if isinstance(provider, VllmProviderConfig) and provider.discovery is not None:
            names.setdefault(dns_name(provider), provider.discovery)
    return names


def ordered(addresses: Iterable[str]) -> Addresses:
    """Addresses normalised and in a stable order (IPv4 before IPv6, numerically)."""
    parsed = {ipaddress.ip_address(a) for a in addresses}
    return tuple(a.compressed for a in sorted(parsed, key=lambda a: (a.version, int(a))))


# ---------------------------------------------------------------------- lookups, pure
@dataclass(frozen=True, slots=True)
class Found:
    """The name has these addresses (at least one)."""

    addresses: Addresses


@dataclass(frozen=True, slots=True)
class Empty:
    """The resolver answered: no such name, or no A/AAAA record."""

    reason: str


@dataclass(frozen=True, slots=True)
class Failed:
    """No answer: timeout, SERVFAIL, refused, no server reachable."""

    error: str


Outcome = Found | Empty | Failed


@dataclass(frozen=True, slots=True)
class Change:
    """The address set of ``name`` moved."""

    name: str
    added: Addresses
    removed: Addresses


def diff(name: str, old: Iterable[str], new: Iterable[str]) -> Change | None:
    """What changed from ``old`` to ``new``; None when nothing did."""
    before, after = set(old), set(new)
    if before == after:
        return None
    return Change(name, ordered(after - before), ordered(before - after))


class AddressBook:
    """One DNS name's replica addresses, moved by each lookup's outcome (the rules in the
    module's docstring). ``clock`` stamps answers for ``status``."""

    def __init__(self, name: str, clock: Clock, empty_after: int) -> None:
        self.name = name
        self.empty_after = empty_after
        self.addresses: Addresses = ()
        self.answered_at: float | None = None  # the last Found or Empty
        self.failures = 0  # consecutive failed lookups
        self.empties = 0  # consecutive empty answers
        self.last_error: str | None = None
        self._clock = clock

    def take(self, outcome: Outcome) -> Change | None:
        """Apply one lookup's outcome; the change to the set, if any."""
        if isinstance(outcome, Failed):
            self.failures += 1
            self.last_error = outcome.error
            return None
        self.answered_at = self._clock.now()
        self.failures, self.last_error = 0, None
        if isinstance(outcome, Empty):
            self.empties += 1
            self.last_error = outcome.reason
            if self.empties < self.empty_after:
                return None
            return self._move(())
        self.empties = 0
        return self._move(ordered(outcome.addresses))

    def _move(self, addresses: Addresses) -> Change | None:
        change = diff(self.name, self.addresses, addresses)
        self.addresses = addresses
        return change

    def status(self) -> dict[str, object]:
        """For an admin view: the addresses, the last answer's age, the error streaks."""
        age = None if self.answered_at is None else self._clock.now() - self.answered_at
        return {
            "addresses": list(self.addresses),
            "age_s": age,
            "failures": self.failures,
            "empties": self.empties,
            "last_error": self.last_error,
        }


# ---------------------------------------------------------------------- lookups, DNS
class DnsResolver:
    """A and AAAA lookups of one name with dnspython, no cache (every lookup asks)."""

    def __init__(self, config: DiscoveryConfig) -> None:
        self.timeout_s = config.timeout_s
        self._problem: str | None = None
        self._resolver: dns.asyncresolver.Resolver | None = None
        try:
            if config.nameservers:
                resolver = dns.asyncresolver.Resolver(configure=False)
                resolver.nameservers = [
                    dns.nameserver.Do53Nameserver(address, port)
                    for address, port in config.nameserver_addresses()
                ]
            else:
                resolver = dns.asyncresolver.Resolver()  # /etc/resolv.conf
        except dns.exception.DNSException as exc:  # no resolv.conf, or an unusable one
            self._problem = f"no resolver: {exc}"
            return
        resolver.cache = None
        resolver.lifetime = config.timeout_s
        self._resolver = resolver

    async def lookup(self, name: str) -> Outcome:
        """Both families at once: any address -> Found; any failure -> Failed (no partial
        answer is taken for the whole set); otherwise Empty."""
        if self._resolver is None:
            return Failed(self._problem or "no resolver")
        resolver = self._resolver
        answers = await asyncio.gather(
            _family(resolver, name, "A"), _family(resolver, name, "AAAA")
        )
        failed = [a for a in answers if isinstance(a, Failed)]
        if failed:
            return failed[0]
        found = [address for a in answers if isinstance(a, Found) for address in a.addresses]
        if found:
            return Found(ordered(found))
        reasons = {a.reason for a in answers if isinstance(a, Empty)}
        return Empty(" / ".join(sorted(reasons)))


async def _family(resolver: dns.asyncresolver.Resolver, name: str, rdtype: str) -> Outcome:
    """One record type's lookup (the search list applies, as for getaddrinfo)."""
    try:
        answer = await resolver.resolve(name, rdtype, search=True)
    except dns.resolver.NXDOMAIN:
        return Empty("NXDOMAIN")
    except dns.resolver.NoAnswer:
        return Empty("no A/AAAA record")
    except (dns.exception.DNSException, OSError) as exc:
        return Failed(f"{rdtype} lookup failed: {type(exc).__name__}: {exc}")
    return Found(tuple(str(record) for record in answer))


# ---------------------------------------------------------------------- the loop
@dataclass
class _Watched:
    config: DiscoveryConfig
    book: AddressBook
    resolver: DnsResolver
    next_due: float = 0.0


Apply = Callable[[], Awaitable[None]]


class Discovery:
    """Keeps every discovered name's addresses fresh, each on its own ``interval_s``.

    After each round ``apply`` runs (the gateway compares ``addresses()`` with what its
    runtime serves and rebuilds when they differ; so a failed rebuild is retried next round).
    ``configure`` follows the config (reloads); new names are resolved at once."""

    def __init__(self, clock: Clock, apply: Apply | None = None) -> None:
        self._clock = clock
        self._apply = apply
        self._watched: dict[str, _Watched] = {}
        self._wake = asyncio.Event()

    def names(self) -> list[str]:
        return list(self._watched)

    def configure(self, names: Mapping[str, DiscoveryConfig]) -> None:
        """Watch ``names`` from now on: known names keep their addresses (a changed
        resolver setting takes effect at their next lookup), new ones are due at once."""
        watched: dict[str, _Watched] = {}
        for name, config in names.items():
            known = self._watched.get(name)
            if known is not None and known.config == config:
                watched[name] = known
                continue
            book = AddressBook(name, self._clock, config.empty_after)
            if known is not None:
                book.addresses = known.book.addresses
            watched[name] = _Watched(config, book, DnsResolver(config))
        woken = any(name not in self._watched for name in watched)
        self._watched = watched
        if woken:
            self._wake.set()

    def addresses(self) -> dict[str, Addresses]:
        """Every watched name's current addresses (possibly none)."""
        return {name: w.book.addresses for name, w in self._watched.items()}

    def status(self) -> dict[str, dict[str, object]]:
        return {name: w.book.status() for name, w in self._watched.items()}

    async def refresh(self, names: Iterable[str] | None = None) -> list[Change]:
        """Look up ``names`` (default: all) concurrently; the changes, each logged."""
        chosen = [self._watched[n] for n in (self._watched if names is None else names)]
        now = self._clock.now()
        for watched in chosen:
            watched.next_due = now + watched.config.interval_s
        outcomes = await asyncio.gather(*(w.resolver.lookup(w.book.name) for w in chosen))
        changes = []
        for watched, outcome in zip(chosen, outcomes, strict=True):
            if isinstance(outcome, Failed) and watched.book.failures == 0:
                _log.warning("discovery.lookup_failed", name=watched.book.name, error=outcome.error)
            change = watched.book.take(outcome)
            if change is not None:
                changes.append(change)
                _log.info(
                    "discovery.changed",
                    name=change.name,
                    added=list(change.added),
                    removed=list(change.removed),
                    addresses=list(watched.book.addresses),
                )
        return changes

    async def run(self) -> None:
        """Resolve each name when due and ``apply`` after each round, until cancelled."""
        while True:
            await self._sleep_until_due()
            now = self._clock.now() + 1e-9  # a sleep of exactly the interval finds it due
            due = [name for name, w in self._watched.items() if w.next_due <= now]
            try:
                if due:
                    await self.refresh(due)
                if self._apply is not None:
                    await self._apply()
            except Exception:  # the loop must outlive any one bad round
                _log.exception("discovery.round_failed")

    async def _sleep_until_due(self) -> None:
        self._wake.clear()
        wake = min((w.next_due for w in self._watched.values()), default=None)
        delay = None if wake is None else max(0.0, wake - self._clock.now())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._wake.wait()
