"""Shared pytest setup: anyio runs async tests on asyncio."""

from __future__ import annotations

import pytest

# PostgreSQL: scratch databases on the shared server, a private server (postgres_server.py).
from tests.fixtures.postgres_server import pg_database, pg_dsn, postgres_server, shared_postgres  # noqa: F401

# A real redis-server on a free loopback port (session) and an emptied URL per test.
from tests.fixtures.redis_server import redis_server, redis_url  # noqa: F401


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
