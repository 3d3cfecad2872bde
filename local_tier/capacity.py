"""Capacity signals of local replicas: a ``/metrics`` poller plus the gateway's own accounting.

``CapacityMonitor(replicas, client, clock)`` watches local replicas (vLLM, SGLang, TGI,
TensorRT-LLM under Triton, llama.cpp servers and JAX workers: each replica's ``engine`` picks the
metrics mapping its page is read through, ``local_tier.engines``) and answers, per replica label:

- ``health(label)`` -> ``TargetHealth`` (saturated, waiting, running, kv_usage, in_flight,
  ttft_s, cache_hit_rate; ``prefix_blocks`` too given the request's hashes and a
  ``PrefixIndex``). Labels it does not watch get ``UNKNOWN``.
- ``can_take(label, ttft_objective_s)``: whether the replica can start this request within
  its TTFT objective, so the router spills over to the next target instead of queueing.

How the numbers are made:

- One background task (``start()``/``aclose()``) polls each replica's ``/metrics`` every
  ``poll_interval_s``, concurrently, each poll bounded by ``poll_timeout_s``. A failed poll
  keeps the last snapshot, which goes stale after ``stale_after_s``; stale counts as
  saturated. ``poll_once()`` is one round on demand; ``on_poll`` runs after each round (the
  admission queue's ``notify``).
- Pages are cut to the few series the replica's mapping reads before parsing: a vLLM page has
  ~600 lines and costs ~8 ms to parse whole, the cut page ~0.5 ms, which matters at 10 polls/s
  per replica.
- Between polls the gateway's own traffic moves the snapshot: ``sent``/``done`` count
  requests and prompt tokens in flight (from an attempt's start to the end of the request:
  a stream keeps the replica busy after its first chunk); ``saturation.estimate``
  applies the change since the poll to running/waiting (a burst fills the batch on paper
  and trips ``max_waiting`` before the next poll), and new prompt tokens add to KV use when
  the page gives the pool's size (vLLM's ``cache_config_info``, SGLang's and TGI's token pools,
  TensorRT-LLM's block counts).
- KV use unknown (an engine that exports none: llama.cpp's newer builds, TGI's v2 backend):
  the rule is given 0 for it, so its KV marks never trip and saturation rests on
  ``max_waiting`` and ``max_in_flight`` (set it for such engines); ``health`` reports 0 too.
- TTFT: an EWMA of the replica's mean TTFT per poll (deltas of its TTFT histogram's sum and
  count, where the engine exports one) and of TTFTs the gateway observes
  (``observe_ttft``). A new request is predicted at ``ttft * (1 + waiting)``: each request
  ahead costs about one TTFT. Crude and cautious (recent TTFTs include queueing under load);
  a poll that finds the replica idle with no new TTFTs drops the estimate (no data again).
- Counters going backwards mean the worker restarted: baselines reset and the prefix index
  forgets it (its KV cache is empty).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

import httpx
import msgspec

from core.clock import Clock
from core.routing import UNKNOWN, TargetHealth
from local_tier.prefix_index import PrefixIndex, whole_kv_blocks
from local_tier.replicas import Replica, ReplicaSpec, watch
from local_tier.saturation import ReplicaSignals, estimate
from local_tier.vllm import metrics as vm
from local_tier.vllm.metrics import split_page, ttft_totals

_log = logging.getLogger("switchyard.capacity")
Sleep = Callable[[float], Awaitable[None]]


class CapacityMonitor:
    """Per-replica saturation and TTFT prediction from polled metrics and own accounting.

    ``replicas`` maps a label (the target label the router uses) to its ``ReplicaSpec``.
    ``client`` is the shared HTTP client (not closed here). ``sleep`` is injectable so tests
    drive the polling loop without waiting. Not thread-safe: use from one event loop.
    """

    def __init__(
        self,
        replicas: Mapping[str, ReplicaSpec],
        client: httpx.AsyncClient,
        clock: Clock,
        *,
        prefix_index: PrefixIndex | None = None,
        on_poll: Callable[[], None] | None = None,
        poll_timeout_s: float = 0.5,
        ttft_alpha: float = 0.3,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._replicas = {label: watch(spec) for label, spec in replicas.items()}
        self._client = client
        self._clock = clock
        self.prefix_index = prefix_index
        self._on_poll = on_poll
        self._timeout = poll_timeout_s
        self._alpha = ttft_alpha
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None

    def labels(self) -> list[str]:
        """The replicas watched now."""
        return list(self._replicas)

    def knows(self, label: str) -> bool:
        return label in self._replicas

    def configure(self, replicas: Mapping[str, ReplicaSpec]) -> None:
        """Watch ``replicas`` from now on (a policy reload): replicas whose spec did not
        change keep what was learnt about them; the others start fresh."""
        kept = {
            label: replica
            for label, replica in self._replicas.items()
            if replicas.get(label) == replica.spec
        }
        for label, spec in replicas.items():
            if label not in kept:
                kept[label] = watch(spec)
        self._replicas = kept
        if self._task is not None and self._task.done() and self._replicas:
            self._task = asyncio.create_task(self._run(), name="capacity-monitor")

    # ------------------------------------------------------------------ polling
    async def start(self) -> None:
        """Start the polling task (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="capacity-monitor")

    async def aclose(self) -> None:
        """Stop polling; the HTTP client stays open (it is the caller's)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            try:
                await self._poll_due()
            except Exception:  # the loop must outlive any one bad round
                _log.exception("capacity.poll_round_failed")
            if not self._replicas:
                return
            wake = min(r.next_due for r in self._replicas.values())
            await self._sleep(max(0.0, wake - self._clock.now()))

    async def _poll_due(self) -> None:
        # A nanosecond of slack: a sleep of exactly the interval must find the replica due.
        now = self._clock.now() + 1e-9
        due = [label for label, r in self._replicas.items() if r.next_due <= now]
        if due:
            await self.poll_once(due)

    async def poll_once(self, labels: Iterable[str] | None = None) -> None:
        """Poll ``labels`` (default: all) concurrently, then call ``on_poll``."""
        chosen = list(self._replicas) if labels is None else list(labels)
        await asyncio.gather(*(self._poll(label) for label in chosen))
        if self._on_poll is not None:
            self._on_poll()

    async def _poll(self, label: str) -> None:
        replica = self._replicas[label]
        started = self._clock.now()
        replica.next_due = started + replica.spec.saturation.poll_interval_s
        in_flight, tokens = replica.in_flight, replica.tokens
        try:
            async with asyncio.timeout(self._timeout):
                response = await self._client.get(replica.spec.metrics_url, timeout=self._timeout)
            if response.status_code != 200:
                raise vm.MetricsError(f"answered {response.status_code}")
            page, ttft_lines = split_page(response.text, replica.mapping)
            snapshot = vm.parse_metrics(page, read_at=self._clock.now(), mapping=replica.mapping)
        except (httpx.HTTPError, vm.MetricsError, TimeoutError) as exc:
            self._failed(label, replica, exc)
            return
        if replica.failures:
            _log.info("capacity.poll_recovered", extra={"replica": label})
        replica.failures, replica.last_error = 0, None
        replica.in_flight_at_poll, replica.tokens_at_poll = in_flight, tokens
        self._take(label, replica, snapshot, ttft_totals(ttft_lines, replica.mapping))

    def _failed(self, label: str, replica: Replica, exc: BaseException) -> None:
        replica.failures += 1
        replica.last_error = repr(exc)
        if replica.failures == 1:  # once per outage, not ten times a second
            _log.warning("capacity.poll_failed", extra={"replica": label, "error": repr(exc)})

    def _take(
        self,
        label: str,
        replica: Replica,
        snapshot: vm.MetricsSnapshot,
        totals: tuple[float, float] | None,
    ) -> None:
        previous = replica.snapshot
        restarted = previous is not None and (
            snapshot.prefix_cache_queries < previous.prefix_cache_queries
        )
        if restarted:
            replica.ttft_totals = None
            if self.prefix_index is not None:
                self.prefix_index.forget(label)
        if not self._take_ttft(replica, totals) and snapshot.idle and replica.in_flight == 0:
            # Idle and nothing new: the queueing the estimate included is gone. Dropping it
            # lets the next request through to measure afresh; otherwise a replica excluded
            # for a slow TTFT would never get the request that shows it has recovered.
            replica.ttft_s = None
        self._learn_slots(replica, snapshot)
        if self.prefix_index is not None and snapshot.kv_capacity_tokens:
            self.prefix_index.set_capacity_tokens(label, snapshot.kv_capacity_tokens)
        replica.snapshot = snapshot
        replica.polls += 1
        replica.saturated = replica.rule.update(
            replica.saturated, self._signals(replica), self._clock.now()
        )

    def _take_ttft(self, replica: Replica, totals: tuple[float, float] | None) -> bool:
        """Blend the mean TTFT of the requests finished since the last poll; True if any."""
        before, replica.ttft_totals = replica.ttft_totals, totals
        if totals is None or before is None:
            return False
        added_sum, added_count = totals[0] - before[0], totals[1] - before[1]
        if added_count <= 0 or added_sum < 0:
            return False  # none new, or counters reset: the new totals are the baseline
        self._blend_ttft(replica, added_sum / added_count)
        return True

    def _blend_ttft(self, replica: Replica, seconds: float) -> None:
        old = replica.ttft_s
        replica.ttft_s = seconds if old is None else old + self._alpha * (seconds - old)

    def _learn_slots(self, replica: Replica, snapshot: vm.MetricsSnapshot) -> None:
        # A queue while KV has room (or KV use is unknown: llama.cpp defers a request only when
        # every slot is busy) means the running batch is full: its size is the slots.
        kv = snapshot.kv_cache_usage_perc
        if snapshot.num_requests_waiting > 0 and (
            kv is None or kv < replica.spec.saturation.kv_high
        ):
            running = snapshot.num_requests_running
            if running > 0 and (replica.learned_slots or 0) < running:
                replica.learned_slots = running

    # ------------------------------------------------------------------ accounting
    def sent(self, label: str, tokens: int = 0) -> None:
        """The gateway sent a request with ``tokens`` prompt tokens to ``label``."""
        replica = self._replicas.get(label)
        if replica is not None:
            replica.in_flight += 1
            replica.tokens += max(0, tokens)

    def done(self, label: str, tokens: int = 0) -> None:
        """A request ``sent`` earlier finished (any outcome); ``tokens`` as given to ``sent``."""
        replica = self._replicas.get(label)
        if replica is not None:
            replica.in_flight = max(0, replica.in_flight - 1)
            replica.tokens = max(0, replica.tokens - max(0, tokens))

    def observe_ttft(self, label: str, seconds: float) -> None:
        """A TTFT the gateway measured on ``label`` (first chunk, or the whole answer)."""
        replica = self._replicas.get(label)
        if replica is not None and seconds >= 0:
            self._blend_ttft(replica, seconds)

    # ------------------------------------------------------------------ answers
    def _signals(self, replica: Replica) -> ReplicaSignals:
        snap = replica.snapshot
        if snap is None:
            return ReplicaSignals(read_at=None, in_flight=replica.in_flight)
        kv = snap.kv_cache_usage_perc  # None: unknown, given to the rule as 0 (see above)
        capacity = snap.kv_capacity_tokens
        new_tokens = replica.tokens - replica.tokens_at_poll
        if kv is None:
            kv = 0.0
        elif capacity and new_tokens > 0:
            kv = min(1.0, kv + new_tokens / capacity)
        return estimate(
            snap.read_at,
            snap.num_requests_running,
            snap.num_requests_waiting,
            kv,
            net_sent=replica.in_flight - replica.in_flight_at_poll,
            in_flight=replica.in_flight,
            slots=replica.slots(),
        )

    def signals(self, label: str) -> ReplicaSignals:
        """The current estimated signals of ``label`` (KeyError when not watched)."""
        return self._signals(self._replicas[label])

    def _refresh(self, replica: Replica) -> tuple[ReplicaSignals, bool]:
        signals = self._signals(replica)
        replica.saturated = replica.rule.update(replica.saturated, signals, self._clock.now())
        return signals, replica.saturated

    def saturated(self, label: str) -> bool:
        """Whether ``label`` is saturated now (False for labels not watched)."""
        replica = self._replicas.get(label)
        return False if replica is None else self._refresh(replica)[1]

    def health(self, label: str, prefix_hashes: Sequence[int] = ()) -> TargetHealth:
        """``label``'s health now; ``UNKNOWN`` for labels not watched. With the request's
        ``prefix_hashes`` and a prefix index, ``prefix_blocks`` says how many it likely holds."""
        replica = self._replicas.get(label)
        if replica is None:
            return UNKNOWN
        signals, saturated = self._refresh(replica)
        blocks = 0
        snap = replica.snapshot
        if prefix_hashes and self.prefix_index is not None:
            blocks = self.prefix_index.matched(label, prefix_hashes)
            kv_block = snap.block_size if snap and snap.block_size else replica.spec.block_size
            blocks = whole_kv_blocks(blocks, kv_block)
        return TargetHealth(
            ttft_s=replica.ttft_s,
            saturated=saturated,
            waiting=signals.waiting,
            running=signals.running,
            kv_usage=signals.kv_usage,
            in_flight=signals.in_flight,
            prefix_blocks=blocks,
            cache_hit_rate=snap.prefix_hit_rate if snap else None,
        )

    def predicted_ttft(self, label: str) -> float | None:
        """Expected TTFT of a request sent to ``label`` now; ``None`` without TTFT data."""
        replica = self._replicas.get(label)
        if replica is None or replica.ttft_s is None:
            return None
        return replica.ttft_s * (1 + self._signals(replica).waiting)

    def can_take(self, label: str, ttft_objective_s: float | None = None) -> bool:
        """Whether ``label`` can take a request now and (given an objective, and TTFT data to
        predict from) start answering within ``ttft_objective_s``. Saturated or stale
        replicas cannot; labels not watched always can (they are not ours to judge)."""
        replica = self._replicas.get(label)
        if replica is None:
            return True
        if self._refresh(replica)[1]:
            return False
        if ttft_objective_s is None:
            return True
        predicted = self.predicted_ttft(label)
        return predicted is None or predicted <= ttft_objective_s

    def status(self) -> dict[str, dict[str, object]]:
        """Per replica, for an admin/debug view: the last poll's age, errors and estimates."""
        now = self._clock.now()
        out: dict[str, dict[str, object]] = {}
        for label, replica in self._replicas.items():
            signals = self._signals(replica)
            out[label] = {
                **msgspec.structs.asdict(self.health(label)),
                "age_s": None if signals.read_at is None else now - signals.read_at,
                "polls": replica.polls,
                "failures": replica.failures,
                "last_error": replica.last_error,
                "slots": replica.slots(),
            }
        return out
