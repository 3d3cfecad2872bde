"""The real-Prometheus world, built once for the package (tests/servers/world.py)."""

from tests.servers.world import world

__all__ = ["world"]
