"""The durable job store behind OpenAI's Files and Batch APIs (docs/batches.md).

One SQLite file (``batch.path``; by default ``switchyard-batches.sqlite3`` next to the
ledger) holds uploaded and output files, batches and their items. Processes that open the
same file share the work: items are claimed under leases (``work``), so none runs twice
while its runner is alive and none is lost when it dies; a finished item's result is
written with its state in one transaction, so it never runs again. ``JobStore`` (``store``)
is the async face; ``jsonl`` reads input files; ``objects`` holds the wire shapes.

Why SQLite and not the shared ``Store`` (memory/Redis): batches need files of up to
hundreds of megabytes, transactions over many rows (a claim, a finalize) and durability
across restarts on a single host; the issue asks for exactly that. Replicas on several
hosts would need another backend behind the same functions.
"""

from __future__ import annotations

from pathlib import Path

from core.config import Config, relative_to_config
from policies.jobs.store import JobStore

DEFAULT_NAME = "switchyard-batches.sqlite3"

__all__ = ["DEFAULT_NAME", "JobStore", "jobs_path"]


def jobs_path(config: Config) -> Path:
    """The job store's file: ``batch.path`` (relative paths start at the policy file), else
    ``DEFAULT_NAME`` in the folder of the SQLite ledger's file."""
    if config.batch.path is not None:
        return relative_to_config(config, config.batch.path)
    return relative_to_config(config, config.ledger.path).parent / DEFAULT_NAME
