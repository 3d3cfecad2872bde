"""A runtime snapshot: the providers, targets and executor built from one config.

Requests take the snapshot once and keep it to the end, so a reload (swap of the reference)
never changes a request in flight.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import httpx
import msgspec
import structlog
from msgspec import Struct

from core.clock import Clock, SystemClock
from core.config import (
    AnthropicProviderConfig,
    Config,
    GeminiProviderConfig,
    JaxProviderConfig,
    OpenAIProviderConfig,
    ProviderConfig,
    TargetConfig,
    VllmProviderConfig,
)
from core.errors import ModelNotFoundError
from core.protocols import Provider, Timeouts
from core.tenancy import Principal
from gateway.process.target_prices import resolve_target_price
from local_tier.discovery import dns_name, replica_config, replica_name
from local_tier.workers.replicas import managed_key, managed_replica_config
from policies.auth import Authenticator
from policies.quotas import QuotaManager
from policies.quotas.releases import PendingReleases
from policies.store.base import Store
from routers.executor import Executor
from routers.strategies import Strategy, build_strategy
from routers.targets import Skipped, Target

_log = structlog.get_logger("switchyard")
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Stores:
    """The shared store (memory or Redis) and this replica's own memory store, which
    fail-open quotas fall back to while the shared one is unreachable; ``releases`` holds
    the concurrency leases a failed settle left behind (it outlives reloads)."""

    shared: Store
    local: Store
    releases: PendingReleases = field(default_factory=PendingReleases)
    # the control plane's key check (gateway.process.control), when ``control:`` is set
    control_keys: Callable[[str], Principal | None] | None = None

    async def aclose(self) -> None:
        await self.shared.aclose()
        if self.local is not self.shared:
            await self.local.aclose()


class DisabledProvider(Struct, frozen=True):
    name: str
    reason: str


def _api_key(config: ProviderConfig, env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(key, reason it is unusable). No ``api_key_env`` means the upstream needs no key."""
    if config.api_key_env is None:
        return None, None
    key = env.get(config.api_key_env, "")
    if not key:
        return None, f"environment variable {config.api_key_env} is not set"
    return key, None


def build_provider(
    name: str,
    config: ProviderConfig,
    client: httpx.AsyncClient,
    key: str | None,
    progress: Progress | None = None,
) -> Provider:
    """The adapter for one configured provider. Heavy kinds are imported only when used."""
    if isinstance(config, OpenAIProviderConfig | VllmProviderConfig):
        from providers.openai import OpenAIProvider

        return OpenAIProvider(name, client, config, key)
    if isinstance(config, AnthropicProviderConfig):
        from providers.anthropic import AnthropicProvider

        return AnthropicProvider(name, client, config, key)
    if isinstance(config, GeminiProviderConfig):
        from providers.gemini import GeminiProvider

        return GeminiProvider(name, client, config, key)
    if isinstance(config, JaxProviderConfig):
        from local_tier.provider import JaxProvider

        return JaxProvider(name, config, progress=progress)
    raise TypeError(f"unknown provider config {type(config).__name__}")


def _instances(
    name: str, config: ProviderConfig, replicas: Mapping[str, Sequence[str]], managed: bool
) -> Iterator[tuple[str, str | None, ProviderConfig]]:
    """(provider name, replica address, its config) for each instance of provider ``name``:
    itself, or for a discovered one each address its DNS name has (maybe none), or for one
    served by ``workers:`` (``managed``) each ready worker's ``127.0.0.1:PORT``."""
    if managed and isinstance(config, VllmProviderConfig):
        for address in replicas.get(managed_key(name), ()):
            yield replica_name(name, address), address, managed_replica_config(config, address)
        return
    if not isinstance(config, VllmProviderConfig) or config.discovery is None:
        yield name, None, config
        return
    for address in replicas.get(dns_name(config), ()):
        yield replica_name(name, address), address, replica_config(config, address)


def _timeouts(config: ProviderConfig) -> Timeouts:
    return Timeouts(
        connect=config.connect_timeout_s,
        total=config.timeout_s,
        first_token=min(config.first_token_timeout_s, config.timeout_s),
        idle=config.stream_idle_timeout_s,
    )


class Runtime:
    """Everything a request needs from the config, built once per (re)load.

    ``previous`` is the snapshot being replaced: providers whose config (and key) did not
    change are carried over as they are (a local model is not reloaded); the ones left
    behind are listed in ``retired`` for the caller to close once requests drain.

    ``replicas`` maps each DNS name discovered providers use to its addresses
    (local_tier/discovery.py); None keeps the previous snapshot's, so a reload never waits
    for DNS. A discovered provider is one provider per address (``<name>@<address>``) and
    each of its targets one target per replica; with no address its targets are skipped."""

    def __init__(
        self,
        config: Config,
        client: httpx.AsyncClient,
        env: Mapping[str, str] | None = None,
        progress: Progress | None = None,
        previous: Runtime | None = None,
        *,
        stores: Stores,
        clock: Clock | None = None,
        replicas: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.config = config
        self.env = os.environ if env is None else env
        clock = clock or SystemClock()
        self.executor = Executor(config.routing)
        self.auth: Authenticator = Authenticator(
            config,
            self.env,
            clock,
            previous=previous.auth if previous else None,
            control_keys=stores.control_keys,
        )
        self.quotas = QuotaManager(
            config.tenants, stores.shared, stores.local, clock, releases=stores.releases
        )
        self.strategies: dict[str, Strategy] = {
            alias: build_strategy(model.strategy) for alias, model in config.models.items()
        }
        self.versions = {
            alias: hashlib.blake2b(msgspec.json.encode(model.targets), digest_size=8).hexdigest()
            for alias, model in config.models.items()
        }
        if replicas is None:
            replicas = previous.replicas if previous else {}
        self.replicas: dict[str, tuple[str, ...]] = {
            dns_name(c): tuple(replicas.get(dns_name(c), ()))
            for c in config.providers.values()
            if isinstance(c, VllmProviderConfig) and c.discovery is not None
        }
        # providers served by `workers:` processes: their ready workers' addresses
        self.managed = {w.provider for w in config.workers.values()} & set(config.providers)
        for managed in self.managed:
            self.replicas[managed_key(managed)] = tuple(replicas.get(managed_key(managed), ()))
        self.providers: dict[str, Provider] = {}
        self.disabled: list[DisabledProvider] = []
        self._fresh: list[Provider] = []
        self._keys: dict[str, str | None] = {}
        self._configs: dict[str, ProviderConfig] = {}  # each provider's own config
        # configured name -> its instances: (provider name, replica address or None)
        self._instances: dict[str, list[tuple[str, str | None]]] = {}
        for name, provider_config in config.providers.items():
            self._build(name, provider_config, client, progress, previous)
        kept = {id(p) for p in self.providers.values()}
        self.retired = [
            p for p in (previous.providers.values() if previous else ()) if id(p) not in kept
        ]
        self.targets: dict[str, list[Target]] = {}
        self.skipped: dict[str, list[Skipped]] = {}
        for alias, model in config.models.items():
            self._resolve(alias, model.targets)

    def _build(
        self,
        name: str,
        config: ProviderConfig,
        client: httpx.AsyncClient,
        progress: Progress | None,
        previous: Runtime | None,
    ) -> None:
        """The provider(s) of configured provider ``name``, carried over where unchanged."""
        key, problem = _api_key(config, self.env)
        if problem:
            self.disabled.append(DisabledProvider(name, problem))
            _log.warning("provider.disabled", provider=name, reason=problem)
            return
        self._instances[name] = []
        instances = _instances(name, config, self.replicas, name in self.managed)
        for instance, address, instance_config in instances:
            reused = previous._reusable(instance, instance_config, key) if previous else None
            if reused is None:
                reused = build_provider(instance, instance_config, client, key, progress)
                self._fresh.append(reused)
            self.providers[instance] = reused
            self._configs[instance] = instance_config
            self._keys[instance] = key
            self._instances[name].append((instance, address))

    def _reusable(self, name: str, config: ProviderConfig, key: str | None) -> Provider | None:
        """This snapshot's provider ``name`` if it was built from the same config and key."""
        mine = self._configs.get(name)
        if name in self.providers and mine == config and self._keys.get(name) == key:
            return self.providers[name]
        return None

    def config_of(self, target: Target) -> ProviderConfig:
        """The config ``target``'s provider was built from (a discovered replica's has its
        address in ``base_url``)."""
        name = target.provider_name
        return self._configs[replica_name(name, target.replica) if target.replica else name]

    def labels(self) -> list[str]:
        """Every target's label, once (aliases may share a target)."""
        labels = (t.label for targets in self.targets.values() for t in targets)
        return list(dict.fromkeys(labels))

    def _resolve(self, alias: str, configured: list[TargetConfig]) -> None:
        reasons = {d.name: d.reason for d in self.disabled}
        targets, skipped = [], []
        for entry in configured:
            name = entry.provider
            if name in reasons:
                skipped.append(Skipped(f"{name}/{entry.model}", reasons[name]))
                continue
            instances = self._instances[name]
            if not instances:
                skipped.append(Skipped(f"{name}/{entry.model}", self._no_replicas(name)))
                continue
            for instance, address in instances:
                # the target's weight is shared by its replicas (the split between targets holds)
                weight = entry.weight / len(instances)
                targets.append(self._target(alias, entry, instance, address, weight))
        self.targets[alias] = targets
        self.skipped[alias] = skipped

    def _target(
        self, alias: str, entry: TargetConfig, instance: str, address: str | None, weight: float
    ) -> Target:
        provider_config = self._configs[instance]
        provider = self.providers[instance]
        price, max_context = resolve_target_price(
            alias, entry, provider_config, provider.capabilities.max_context
        )
        return Target(
            alias=alias,
            provider_name=entry.provider,
            model=entry.model,
            provider=provider,
            timeouts=_timeouts(provider_config),
            weight=weight,
            price=price,
            local=provider_config.local,
            max_context=max_context,
            replica=address,
        )

    def _no_replicas(self, name: str) -> str:
        if name in self.managed:
            return "no replicas: none of its workers is ready yet (workers:)"
        config = self.config.providers[name]
        host = dns_name(config) if isinstance(config, VllmProviderConfig) else name
        return f"no replicas: DNS name {host} has no known address (discovery)"

    def plan_for(self, alias: str) -> tuple[list[Target], list[Skipped]]:
        """The targets of ``alias`` in priority order; 404 for an alias nobody configured."""
        if alias not in self.targets:
            raise ModelNotFoundError(
                f"The model '{alias}' does not exist or you do not have access to it.",
                param="model",
            )
        return self.targets[alias], self.skipped[alias]

    def is_ready(self) -> bool:
        return all(provider.is_ready() for provider in self.providers.values())

    async def start(self) -> None:
        """Start the providers this snapshot built (carried-over ones are running), then
        its JWT key source (``ConfigError`` when the identity provider's answer is unusable)."""
        for provider in self._fresh:
            await provider.start()
        # after the providers: a reload whose provider fails leaves no key refresher running
        await self.auth.start()

    async def aclose(self) -> None:
        for provider in self.providers.values():
            await provider.aclose()
        await self.auth.aclose()
