"""The app's long-lived state: the HTTP client, shared-state store, usage ledger, what the
gateway learns about targets, and the current runtime snapshot (swapped on reload)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

import structlog

from core.clock import Clock, SystemClock
from core.config import Config, VllmProviderConfig
from core.tenancy import Principal
from gateway.process.control import GatewayControl, open_control
from gateway.process.health import Trackers
from gateway.process.runtime import Progress, Runtime, Stores
from gateway.process.workers import config_dir, worker_replicas
from local_tier.capacity import CapacityMonitor
from local_tier.discovery import Discovery, discovered_names
from local_tier.prefix_index import PrefixIndex
from local_tier.replicas import ReplicaSpec
from local_tier.workers import Supervisor
from policies.admission import AdmissionQueue
from policies.breaker import SharedBreakers
from policies.goodput import GoodputMeter
from policies.latency import LatencyStats
from policies.ledger import Ledger, open_ledger
from policies.load_shared import SharedTargetLoad, default_replica_id
from policies.response_cache import ResponseCache
from policies.sticky import StickyRoutes
from policies.store import MemoryStore, RedisStore
from providers.transport import make_client

_log = structlog.get_logger("switchyard")
# Router-side prefix index size per replica, in 64-character blocks (~16 tokens each):
# 4,096 blocks ~ 64k tokens, more than a small CPU replica's KV cache holds.
_PREFIX_BLOCKS_PER_REPLICA = 4096


def open_stores(
    config: Config, clock: Clock, control_keys: Callable[[str], Principal | None] | None = None
) -> Stores:
    """The shared store named by ``state`` and a per-replica memory store for fail-open."""
    local = MemoryStore(clock)
    if config.state.backend == "redis":
        shared = RedisStore(config.state.redis, clock)
        return Stores(shared=shared, local=local, control_keys=control_keys)
    return Stores(shared=local, local=local, control_keys=control_keys)


def target_labels(runtime: Runtime) -> list[str]:
    """Every target's label in ``runtime``, once (a discovered provider's: per replica)."""
    return runtime.labels()


def local_replicas(runtime: Runtime) -> dict[str, ReplicaSpec]:
    """Every target served by a local worker, keyed by target label (one per discovered
    replica, with that replica's metrics URL)."""
    replicas: dict[str, ReplicaSpec] = {}
    for targets in runtime.targets.values():
        for target in targets:
            provider = runtime.config_of(target)
            if isinstance(provider, VllmProviderConfig):
                replicas[target.label] = ReplicaSpec.from_provider(provider)
    return replicas


class InFlight:
    """Counts requests and ledger commits in progress, so shutdown can wait for them, and
    the interactive ones (not the batch runner's) with when the last of them ended, so batch
    work can keep out of their way (``clock.now()`` seconds)."""

    def __init__(self, clock: Clock) -> None:
        self.requests = 0
        self.interactive = 0
        self.interactive_ended_at = -float("inf")  # the last time interactive ones hit 0
        self._clock = clock
        self._idle = asyncio.Event()
        self._idle.set()
        self.commits: set[asyncio.Task[None]] = set()

    def enter(self, *, interactive: bool = True) -> None:
        self.requests += 1
        self.interactive += interactive
        self._idle.clear()

    def leave(self, *, interactive: bool = True) -> None:
        self.requests -= 1
        if interactive:
            self.interactive -= 1
            if self.interactive == 0:
                self.interactive_ended_at = self._clock.now()
        if self.requests == 0:
            self._idle.set()

    def interactive_quiet_for(self) -> float:
        """Seconds since the last interactive request ended (0 while one is in flight)."""
        if self.interactive > 0:
            return 0.0
        return self._clock.now() - self.interactive_ended_at

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no request is in flight (or the timeout); then for every commit."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        finally:
            if self.commits:
                await asyncio.gather(*self.commits, return_exceptions=True)
        return True


class GatewayState:
    """Owns everything that lives as long as the process; ``runtime`` is read once per
    request and replaced as a whole on reload."""

    def __init__(
        self,
        config: Config,
        env: Mapping[str, str] | None = None,
        progress: Progress | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.clock = clock or SystemClock()
        self.client = make_client()
        self.env = os.environ if env is None else env
        self.progress = progress
        self.control = open_control(config, self.env, self.clock)  # None without `control:`
        self.base_config = config  # the policy file's; the runtime's adds the API tenants
        self.rebuild_lock = asyncio.Lock()  # one runtime rebuild at a time (reload, tenants)
        verify = self.control.verify if self.control is not None else None
        self.stores = open_stores(config, self.clock, verify)
        shared = self.stores.shared
        redis = shared if isinstance(shared, RedisStore) else None
        self.ledger: Ledger = open_ledger(config, redis, env=self.env, clock=self.clock)
        self.queue = AdmissionQueue(config.routing.queue, _weights(config), self.clock)
        self.runtime = Runtime(config, self.client, self.env, progress, stores=self.stores)
        # DNS names of discovered providers: resolved at start, then every interval_s
        self.discovery = Discovery(self.clock, self.apply_discovery)
        self.discovery.configure(discovered_names(config))
        # `workers:` processes: launched by start(), served as replicas once ready
        self.workers = Supervisor(self.clock, self.apply_workers)
        self.workers.configure(config.workers, config_dir(config))
        capacity = CapacityMonitor(
            local_replicas(self.runtime),
            self.client,
            self.clock,
            prefix_index=PrefixIndex(_PREFIX_BLOCKS_PER_REPLICA, self.clock),
            on_poll=self.queue.notify,
        )
        # With replicas sharing Redis, each adds the others' in-flight counts to its own.
        self.shared_load = (
            SharedTargetLoad(shared, self.clock, default_replica_id())
            if config.state.backend == "redis"
            else None
        )
        self.trackers = Trackers(
            SharedBreakers(config.routing.breaker, shared, self.clock),
            LatencyStats(self.clock),
            capacity,
            load=self.shared_load,
        )
        self._track(self.runtime)
        self.goodput = GoodputMeter(self.clock)
        self.responses = ResponseCache(config.response_cache, shared, self.clock)
        self.sticky = StickyRoutes(shared, config.routing.prompt_cache.sticky_ttl_s, self.clock)
        self.created = int(time.time())
        self.in_flight = InFlight(self.clock)
        self._start_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Start providers in the background so /healthz answers while a model loads."""
        if self.control is not None:  # first: the runtime's tenants may come from it
            await self._start_control(self.control)
        if self.discovery.names():
            await self._start_discovery()
        await self.workers.start()
        self._start_task = asyncio.create_task(self._start())
        await self.trackers.capacity.start()
        await self.trackers.breakers.start()
        if self.shared_load is not None:
            await self.shared_load.start()
        start_ledger = getattr(self.ledger, "start", None)
        if start_ledger is not None:  # replays rows a previous run spooled during an outage
            await start_ledger()
        self.spawn(self._release_leases())

    def build_runtime(
        self,
        config: Config,
        *,
        previous: Runtime | None = None,
        replicas: Mapping[str, Sequence[str]] | None = None,
    ) -> Runtime:
        """A runtime snapshot of ``config`` on this process's client, environment, stores
        and clock (``previous``: the one it will replace, whose unchanged providers and
        discovered replicas it carries over)."""
        return Runtime(
            config,
            self.client,
            self.env,
            self.progress,
            previous=previous,
            stores=self.stores,
            clock=self.clock,
            replicas=replicas,
        )

    async def _start_control(self, control: GatewayControl) -> None:
        """Open and load the control store; rebuild the (not yet started) runtime when the
        API set tenants; from then on rebuild it whenever they change."""
        await control.start()
        if control.index.tenants:
            self.runtime = self.build_runtime(self.effective(self.base_config))
            self.queue.set_weights(_weights(self.runtime.config))
        control.on_tenants(self.apply_control_tenants)
        self.spawn(control.refresher.run())

    async def _start_discovery(self) -> None:
        """Resolve the discovered names once (each bounded by its ``timeout_s``), rebuild
        the not yet started runtime with the replicas found, then keep them fresh."""
        await self.discovery.refresh()
        self.runtime = self.build_runtime(self.runtime.config, replicas=self.replica_addresses())
        self._track(self.runtime)
        self.spawn(self.discovery.run())

    def replica_addresses(self) -> dict[str, tuple[str, ...]]:
        """The replicas the runtime should serve: discovered addresses and ready workers."""
        workers = worker_replicas(self.workers, self.runtime.config)
        return {**self.discovery.addresses(), **workers}

    async def apply_discovery(self) -> None:
        await self.apply_replicas("discovery")

    async def apply_workers(self) -> None:
        """Called by the supervisor when a worker became ready or left: returns once the
        runtime serves exactly the ready ones (a draining worker gets no new request)."""
        await self.apply_replicas("workers")

    async def apply_replicas(self, source: str) -> None:
        """Serve the replicas discovery and the workers know now, when they differ from the
        runtime's: a rebuild from the same config, swapped in as a reload is (unchanged
        replicas carried over, dropped ones closed after the drain). A failure is logged
        and retried (``source``, discovery or workers, names the log events)."""
        if self.runtime.replicas == self.replica_addresses():
            return
        async with self.rebuild_lock:
            wanted = self.replica_addresses()
            if self.runtime.replicas == wanted:
                return
            try:
                runtime = self.build_runtime(
                    self.runtime.config, previous=self.runtime, replicas=wanted
                )
                await runtime.start()
            except Exception:
                _log.exception(f"{source}.apply_failed")
                return
            await self.swap(runtime, f"{source}.applied")

    def effective(self, config: Config) -> Config:
        """``config`` (the policy file's) with the control plane's tenants merged in."""
        return config if self.control is None else self.control.merged(config)

    async def apply_control_tenants(self) -> None:
        """Serve the policy merged with the API tenants as they are now (called when they
        change). A runtime that cannot be built is logged; the current one keeps serving."""
        async with self.rebuild_lock:
            try:
                runtime = self.build_runtime(
                    self.effective(self.base_config), previous=self.runtime
                )
                await runtime.start()
            except Exception:
                _log.exception("control.tenants_apply_failed")
                return
            await self.swap(runtime)

    async def _release_leases(self) -> None:
        """Retry the lease releases that failed settles left behind, every
        ``state.redis.retry_interval_s`` (a memory store never leaves any)."""
        interval = self.runtime.config.state.redis.retry_interval_s
        releases = self.stores.releases
        while True:
            await asyncio.sleep(interval)
            if len(releases):
                await releases.retry()

    async def _start(self) -> None:
        try:
            await self.runtime.start()
        except Exception:
            _log.exception("providers.start_failed")
            raise
        _log.info(
            "gateway.ready",
            models=sorted(self.runtime.targets),
            open_access=self.runtime.config.open_access,
        )

    def startup_failed(self) -> BaseException | None:
        task = self._start_task
        if task is None or not task.done() or task.cancelled():
            return None
        return task.exception()

    async def swap(self, runtime: Runtime, event: str = "config.reloaded") -> None:
        """Make ``runtime`` current; requests holding the old one finish on it. Providers
        the new one dropped are closed after the drain timeout. ``event``: the log line."""
        old, self.runtime = self.runtime, runtime
        config = runtime.config
        self._track(runtime)
        self.discovery.configure(discovered_names(config))
        self.workers.configure(config.workers, config_dir(config))  # a reload's plan
        self.queue.set_weights(_weights(config))
        if runtime.retired:
            self.spawn(_close_later(runtime, config.server.drain_timeout_s))
        await old.auth.aclose()  # its JWT key refresher; the new runtime has its own
        _log.info(event, models=sorted(runtime.targets), replaced=id(old))

    def _track(self, runtime: Runtime) -> None:
        """Point the trackers at ``runtime``'s targets: local replicas polled (a replica
        gone is forgotten by the prefix index too), breakers and shared load refreshed."""
        capacity = self.trackers.capacity
        replicas = local_replicas(runtime)
        if capacity.prefix_index is not None:
            for label in set(capacity.labels()) - set(replicas):
                capacity.prefix_index.forget(label)
        capacity.configure(replicas)
        labels = target_labels(runtime)
        self.trackers.breakers.track(labels)
        if self.shared_load is not None:
            self.shared_load.track(labels)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background (cancelled at shutdown)."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def track(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run a request's closing work (settle, commit) as a task that the request's
        cancellation does not reach and that shutdown waits for (never cancelled)."""
        task = asyncio.create_task(work)
        self.in_flight.commits.add(task)
        task.add_done_callback(self.in_flight.commits.discard)
        task.add_done_callback(_retrieve)  # its failure is logged by the work itself
        return task

    async def aclose(self) -> None:
        """Graceful shutdown: wait for requests in flight (bounded), then close in order."""
        drained = await self.in_flight.drained(self.runtime.config.server.drain_timeout_s)
        if not drained:
            _log.warning("shutdown.drain_timeout", in_flight=self.in_flight.requests)
        if self._start_task is not None and not self._start_task.done():
            self._start_task.cancel()
        for task in list(self._background):
            task.cancel()
        await self.workers.aclose()  # drain and stop every worker process
        await self.trackers.capacity.aclose()
        await self.trackers.breakers.aclose()
        if self.shared_load is not None:  # drained: its last publish clears our counts
            await self.shared_load.aclose()
        await self.runtime.aclose()
        await self.ledger.aclose()
        if self.control is not None:
            await self.control.aclose()
        await self.stores.aclose()
        await self.client.aclose()


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def _weights(config: Config) -> dict[str, float]:
    return {name: tenant.weight for name, tenant in config.tenants.items()}


async def _close_later(runtime: Runtime, delay_s: float) -> None:
    await asyncio.sleep(delay_s)
    for provider in runtime.retired:
        await provider.aclose()
