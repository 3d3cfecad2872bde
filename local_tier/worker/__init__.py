"""The JAX worker process: the local engine behind vLLM's HTTP API (see ``app``)."""

from __future__ import annotations

from local_tier.worker.cli import main

__all__ = ["main"]
