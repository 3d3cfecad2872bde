"""The ``batch:`` section: OpenAI's Files and Batch APIs and their durable job store
(docs/batches.md)."""

from __future__ import annotations

import re
from typing import Annotated

from msgspec import Meta, Struct

PositiveFloat = Annotated[float, Meta(gt=0)]
PositiveInt = Annotated[int, Meta(ge=1)]
Ratio = Annotated[float, Meta(ge=0, le=1)]
Window = Annotated[str, Meta(pattern=r"^[1-9][0-9]*[smhd]$")]
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_WINDOW = re.compile(r"^([1-9][0-9]*)([smhd])$")


class BatchConfig(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """How batches are stored and run.

    ``path``, ``max_file_bytes`` and the store apply at start; the runner reads the rest
    from the current runtime, so a reload changes them for the next claim.

    - ``path``: the job store's SQLite file (files, batches, items). None: a file named
      ``switchyard-batches.sqlite3`` in the ledger file's folder. Replicas that share it
      share the work; relative paths start at the policy file.
    - ``max_file_bytes`` / ``max_requests``: the largest upload and the most request lines
      one input file may hold (OpenAI's: 200 MB, 50,000).
    - ``concurrency``: batch items one gateway runs at once.
    - ``discount``: the share taken off a batch item's cost in the ledger and the spend
      quota (OpenAI's batch price is half: 0.5).
    - ``yield_above_in_flight``: the runner claims no new item while more interactive
      requests than this are in flight on this gateway, or while any request waits in the
      admission queue (items already running finish).
    - ``lease_s``: how long a claimed item is reserved for its runner; the runner renews
      its leases every third of it, so an item is re-run by another runner only when its
      runner stopped renewing (crashed) for this long.
    - ``poll_interval_s``: how often an idle runner looks for work other replicas queued.
    - ``retention_s``: files expire this long after they are created, and a finished
      batch is deleted this long after it ended (OpenAI keeps batch files 30 days).
    - ``sweep_interval_s``: how often expired files and batches are deleted.
    - ``completion_windows``: the windows a batch may ask for (``24h`` is OpenAI's only).
    - ``max_retry_delay_s``: the longest wait before an item refused for now (429, 503)
      is tried again.
    """

    path: str | None = None
    max_file_bytes: PositiveInt = 200 * 1024 * 1024
    max_requests: PositiveInt = 50_000
    concurrency: PositiveInt = 4
    discount: Ratio = 0.5
    yield_above_in_flight: Annotated[int, Meta(ge=0)] = 16
    lease_s: PositiveFloat = 60.0
    poll_interval_s: PositiveFloat = 1.0
    retention_s: PositiveFloat = 30 * 86400.0
    sweep_interval_s: PositiveFloat = 60.0
    completion_windows: tuple[Window, ...] = ("24h",)
    max_retry_delay_s: PositiveFloat = 60.0


def window_seconds(window: str) -> int | None:
    """``24h`` -> 86400; None when ``window`` is not ``<n><s|m|h|d>``."""
    match = _WINDOW.match(window)
    if match is None:
        return None
    return int(match.group(1)) * _UNIT_S[match.group(2)]
