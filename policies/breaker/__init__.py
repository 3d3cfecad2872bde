"""Circuit breakers: the pure state machine (``machine``), its store scripts (``scripts``)
and the replica-shared breakers the gateway uses (``shared.SharedBreakers``)."""

from policies.breaker.machine import BreakerMachine, classify
from policies.breaker.shared import SharedBreakers

__all__ = ["BreakerMachine", "SharedBreakers", "classify"]
