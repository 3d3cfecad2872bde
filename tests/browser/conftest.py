"""Fixtures of the console's browser tests (tests/browser/world.py)."""

from tests.browser.world import browser, world

__all__ = ["browser", "world"]
