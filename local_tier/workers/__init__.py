"""Worker processes the gateway runs itself (the ``workers:`` section, docs/workers.md):
launch specs per engine, the plan a reload makes, the restart schedule, the state machine
and the asyncio supervisor that owns the processes."""

from local_tier.workers.supervisor import Supervisor

__all__ = ["Supervisor"]
