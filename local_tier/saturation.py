"""When a local replica counts as saturated: a pure hysteresis rule over its load signals.

``SaturationRule(config).update(previous, signals, now) -> bool`` is the whole decision:

- No signals yet, or signals older than ``stale_after_s``: saturated. A replica we cannot see
  is not one to send work to (fail towards spill-over, never towards piling on).
- Enter saturation when any high mark is reached: ``waiting > max_waiting``,
  ``kv_usage >= kv_high``, or ``in_flight >= max_in_flight`` (when that limit is set).
- Leave only when every signal is below its low mark: ``waiting <= max_waiting``,
  ``kv_usage < kv_low`` and ``in_flight < max_in_flight``.
- In between (KV use in ``[kv_low, kv_high)``, nothing else high) the previous state holds,
  so a replica hovering around one mark does not flap in and out of the plan.

``estimate(...)`` builds the signals the rule sees between two polls: the last snapshot moved
by the requests the gateway itself sent or finished since that snapshot (see its docstring).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.config_routing import SaturationConfig


@dataclass(frozen=True, slots=True)
class ReplicaSignals:
    """One replica's load as the rule sees it. ``read_at`` (monotonic seconds) is when the
    underlying ``/metrics`` snapshot was taken; ``None`` means no snapshot yet."""

    read_at: float | None
    waiting: int = 0  # requests queued on the replica
    running: int = 0  # requests in the replica's running batch
    kv_usage: float = 0.0  # 0-1
    in_flight: int = 0  # requests the gateway sent there and has not seen finish


class SaturationRule:
    """The hysteresis rule for one replica's ``SaturationConfig``. Pure and stateless: the
    caller keeps the previous state."""

    def __init__(self, config: SaturationConfig) -> None:
        if config.kv_low > config.kv_high:
            raise ValueError("saturation.kv_low must not exceed kv_high")
        self.config = config

    def stale(self, signals: ReplicaSignals, now: float) -> bool:
        """No snapshot yet, or the last one is older than ``stale_after_s``."""
        return signals.read_at is None or now - signals.read_at > self.config.stale_after_s

    def high(self, signals: ReplicaSignals) -> bool:
        """Any signal at or past its high mark."""
        cfg = self.config
        over_limit = cfg.max_in_flight is not None and signals.in_flight >= cfg.max_in_flight
        return signals.waiting > cfg.max_waiting or signals.kv_usage >= cfg.kv_high or over_limit

    def low(self, signals: ReplicaSignals) -> bool:
        """Every signal below its low mark."""
        cfg = self.config
        under_limit = cfg.max_in_flight is None or signals.in_flight < cfg.max_in_flight
        return signals.waiting <= cfg.max_waiting and signals.kv_usage < cfg.kv_low and under_limit

    def update(self, previous: bool, signals: ReplicaSignals, now: float) -> bool:
        """The new saturated state from the previous one and the current signals."""
        if self.stale(signals, now) or self.high(signals):
            return True
        if self.low(signals):
            return False
        return previous


def estimate(
    read_at: float | None,
    polled_running: int,
    polled_waiting: int,
    kv_usage: float,
    *,
    net_sent: int,
    in_flight: int,
    slots: int | None,
) -> ReplicaSignals:
    """The replica's signals now: the last poll moved by the gateway's own traffic since.

    ``net_sent`` is how many more requests the gateway has in flight to the replica than it
    had when the snapshot was taken (sent minus finished since then; negative when more
    finished). Those changes are not in the snapshot yet, so they are applied to it: the
    replica's requests (running + waiting) move by ``net_sent``, and they fill the running
    batch up to its slots, the rest waiting. The slots are ``slots`` (the replica's batch
    size) when known, else the polled running count when the poll showed a queue (a replica
    with waiting requests has a full batch), else unbounded.

    So a burst sent between two polls fills the batch on paper, the ``waiting > max_waiting``
    mark trips, and the rest of the burst spills over instead of all landing on one replica
    before the next poll can show it; requests finishing first let the queue in first. Counts
    never go below 0.
    """
    total = max(0, polled_running + polled_waiting + net_sent)
    cap: int | None = None
    if slots is not None:
        cap = max(slots, polled_running)
    elif polled_waiting > 0:
        cap = polled_running
    running = total if cap is None else min(total, cap)
    return ReplicaSignals(
        read_at=read_at,
        waiting=total - running,
        running=running,
        kv_usage=kv_usage,
        in_flight=in_flight,
    )
