"""Sticky routing: put the target that holds a request's prompt prefix in its cache first.

Pure: the label comes from ``policies.sticky.StickyRoutes`` (read by the gateway); this only
reorders a plan that filters and the strategy already made, so a target that was filtered
out (open breaker, tenant allow-list, context window) is never brought back.
"""

from __future__ import annotations

from routers.targets import Target


def prefer(ordered: list[Target], label: str | None) -> tuple[list[Target], str | None]:
    """``ordered`` with the target named ``label`` moved to the front, and a route reason;
    ``ordered`` unchanged and None when ``label`` is None or not in the plan."""
    if label is None:
        return ordered, None
    for position, target in enumerate(ordered):
        if target.label == label:
            rest = ordered[:position] + ordered[position + 1 :]
            return [target, *rest], f"sticky: {label} holds this prompt prefix"
    return ordered, None
