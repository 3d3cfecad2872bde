"""The ``batch:`` section: OpenAI's Files and Batch APIs and their durable job store
(docs/batches.md)."""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from msgspec import Meta, Struct

PositiveFloat = Annotated[float, Meta(gt=0)]
PositiveInt = Annotated[int, Meta(ge=1)]
Ratio = Annotated[float, Meta(ge=0, le=1)]
Window = Annotated[str, Meta(pattern=r"^[1-9][0-9]*[smhd]$")]
EnvName = Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_WINDOW = re.compile(r"^([1-9][0-9]*)([smhd])$")

WebhookEvent = Literal[
    "batch.completed", "batch.failed", "batch.cancelled", "batch.expired", "batch.in_progress"
]
# OpenAI's batch events (what a webhook gets unless it names others); ``batch.in_progress``
# is Switchyard's own and must be asked for.
OPENAI_BATCH_EVENTS: tuple[WebhookEvent, ...] = (
    "batch.completed",
    "batch.failed",
    "batch.cancelled",
    "batch.expired",
)
ANY_TENANT = "*"  # the webhook of every tenant without its own, and of the open gateway


class WebhookConfig(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Where one tenant's batch events go (docs/batches.md, "Webhooks").

    - ``url``: ``http://`` or ``https://`` with a host; no user:password (the URL is shown
      in the delivery log) and no fragment. Only the operator sets it: a URL a client could
      choose would let it point the gateway at internal services.
    - ``secret_env``: the environment variable holding the signing secret in Standard
      Webhooks' form, ``whsec_`` + base64 of 24 to 64 random bytes (never in the file).
    - ``events``: the event types sent (default: OpenAI's four batch events).
    """

    url: str
    secret_env: Annotated[str, Meta(min_length=1)]
    events: tuple[WebhookEvent, ...] = OPENAI_BATCH_EVENTS

    def __post_init__(self) -> None:
        problem = url_problem(self.url)
        if problem is not None:
            raise ValueError(f"url: {problem}")


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot receive webhooks, or None."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises on a port that is not a number
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "must start with http:// or https://"
    if not parts.hostname:
        return "needs a host"
    if parts.username is not None or parts.password is not None:
        return "must not hold credentials (it is shown in the delivery log)"
    if parts.fragment:
        return "must not have a fragment"
    return None


class BatchConfig(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """How batches are stored and run.

    The store's settings (``backend`` to ``retry_interval_s``) and ``max_file_bytes`` apply
    at start; the runner reads the rest from the current runtime, so a reload changes them
    for the next claim.

    - ``backend``: where the job store lives: ``sqlite`` (one host) or ``postgres`` (a
      fleet). Replicas on the same store share the work.
    - ``path`` (sqlite): the store's file (files, batches, items). None: a file named
      ``switchyard-batches.sqlite3`` in the ledger file's folder; relative paths start at
      the policy file.
    - ``dsn`` / ``dsn_env`` (postgres, one of them): the database's DSN, or the name of
      the environment variable holding it (keeps a password out of the file).
    - ``timeout_s`` (postgres): the longest a connection may take to open.
    - ``retry_interval_s`` (postgres): after the database was found unreachable, calls
      fail at once (503) for this long before one tries again.
    - ``max_file_bytes`` / ``max_requests``: the largest upload and the most request lines
      one input file may hold (OpenAI's: 200 MB, 50,000).
    - ``concurrency``: batch items one gateway runs at once.
    - ``managed_after``: the share of a batch's completion window during which an item
      whose alias has a local target runs on local targets only (when they have room,
      else it waits and is tried again); after it, managed targets take items too, so the
      batch finishes in its window. 1.0: local only until the end; 0: no preference.
    - ``discount``: the share taken off a batch item's cost in the ledger and the spend
      quota (OpenAI's batch price is half: 0.5).
    - ``yield_above_in_flight``: the runner claims no new item while more interactive
      requests than this are in flight on this gateway, or while any request waits in the
      admission queue (items already running finish).
    - ``yield_quiet_s``: with ``yield_above_in_flight: 0``, also none until this long after
      the last interactive request ended (a gap in a burst is not idle capacity).
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
    - ``webhooks``: tenant name -> ``WebhookConfig``; ``"*"`` is the webhook of tenants
      without one of their own and of the open gateway's (and admin key's) batches.
    - ``webhook_max_attempts``: deliveries of one event before it is marked failed.
    - ``webhook_retry_base_s`` / ``webhook_max_retry_delay_s``: the wait after the n-th
      failed attempt is ``base * 2**(n-1)`` plus up to a quarter of it (jitter), at most
      the maximum (or the receiver's ``Retry-After`` when that is longer, within it).
    - ``webhook_timeout_s``: how long one attempt may take, connect to status line.
    - ``provider_poll_interval_s``: how often a batch sent to a provider's own batch API
      (a provider with ``batch_api: true``) is polled for its status.
    """

    backend: Literal["sqlite", "postgres"] = "sqlite"
    path: str | None = None
    dsn: str | None = None
    dsn_env: EnvName | None = None
    timeout_s: PositiveFloat = 5.0
    retry_interval_s: PositiveFloat = 1.0
    max_file_bytes: PositiveInt = 200 * 1024 * 1024
    max_requests: PositiveInt = 50_000
    concurrency: PositiveInt = 4
    managed_after: Ratio = 0.5
    discount: Ratio = 0.5
    yield_above_in_flight: Annotated[int, Meta(ge=0)] = 16
    yield_quiet_s: Annotated[float, Meta(ge=0)] = 2.0
    lease_s: PositiveFloat = 60.0
    poll_interval_s: PositiveFloat = 1.0
    retention_s: PositiveFloat = 30 * 86400.0
    sweep_interval_s: PositiveFloat = 60.0
    completion_windows: tuple[Window, ...] = ("24h",)
    max_retry_delay_s: PositiveFloat = 60.0
    webhooks: dict[str, WebhookConfig] = {}
    webhook_max_attempts: PositiveInt = 16
    webhook_retry_base_s: PositiveFloat = 5.0
    webhook_max_retry_delay_s: PositiveFloat = 6 * 3600.0
    webhook_timeout_s: PositiveFloat = 15.0
    provider_poll_interval_s: PositiveFloat = 30.0

    def __post_init__(self) -> None:
        problem = self._store_problem()
        if problem is not None:
            raise ValueError(problem)

    def _store_problem(self) -> str | None:
        given = [name for name in ("dsn", "dsn_env") if getattr(self, name)]
        if self.backend == "sqlite":
            if given:
                return f"`{given[0]}`: only backend postgres uses it"
            return None
        if not given:
            return (
                "backend postgres needs `dsn`, or `dsn_env` (the name of an environment"
                " variable holding the DSN, e.g. SWITCHYARD_BATCH_DSN)"
            )
        if len(given) == 2:
            return "give `dsn` or `dsn_env`, not both"
        if self.path is not None:
            return "`path`: only backend sqlite uses it (the postgres store is the database)"
        return None


def window_seconds(window: str) -> int | None:
    """``24h`` -> 86400; None when ``window`` is not ``<n><s|m|h|d>``."""
    match = _WINDOW.match(window)
    if match is None:
        return None
    return int(match.group(1)) * _UNIT_S[match.group(2)]
