"""Routing: filters -> plan (pure) -> executor (retries, fallback, streams)."""
