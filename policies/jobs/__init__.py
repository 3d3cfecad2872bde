"""The durable job store behind OpenAI's Files and Batch APIs (docs/batches.md).

Uploaded and output files, batches and their items live in one database: a SQLite file
(``batch.backend: sqlite``, the default; ``batch.path``, by default
``switchyard-batches.sqlite3`` next to the ledger) for one host, or PostgreSQL
(``batch.backend: postgres``, ``postgres``) for a fleet. Processes on the same store share
the work: items are claimed under leases (``work``), so none runs twice while its runner is
alive and none is lost when it dies; a finished item's result is written with its state in
one transaction, so it never runs again. ``JobStore`` (``store``) is the async face;
``db`` is the seam between the SQL (written once) and the two databases; ``jsonl`` reads
input files; ``objects`` holds the wire shapes.

Why not the shared ``Store`` (memory/Redis): batches need files of up to hundreds of
megabytes, transactions over many rows (a claim, a finalize) and durability across
restarts; the issue asks for exactly that.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from core.clock import Clock
from core.config import Config, relative_to_config
from policies.jobs.store import JobStore

DEFAULT_NAME = "switchyard-batches.sqlite3"

__all__ = ["DEFAULT_NAME", "JobStore", "job_store", "jobs_path"]


def jobs_path(config: Config) -> Path:
    """The job store's file: ``batch.path`` (relative paths start at the policy file), else
    ``DEFAULT_NAME`` in the folder of the SQLite ledger's file."""
    if config.batch.path is not None:
        return relative_to_config(config, config.batch.path)
    return relative_to_config(config, config.ledger.path).parent / DEFAULT_NAME


def job_store(config: Config, clock: Clock, env: Mapping[str, str] | None = None) -> JobStore:
    """The job store ``batch.backend`` names, not yet opened. Postgres reads the DSN from
    ``batch.dsn`` or the variable ``batch.dsn_env`` names in ``env`` (default: the process
    environment); ``ConfigError`` when that variable is unset."""
    settings = config.batch
    if settings.backend == "postgres":
        from policies.jobs.postgres import PostgresJobs
        from policies.pg import resolve_dsn

        dsn = resolve_dsn(settings.dsn, settings.dsn_env, env, section="batch")
        where: Path | PostgresJobs = PostgresJobs(dsn, timeout_s=settings.timeout_s)
    else:
        where = jobs_path(config)
    return JobStore(
        where, clock, retention_s=settings.retention_s, retry_interval_s=settings.retry_interval_s
    )
