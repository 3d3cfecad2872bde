"""Fixtures for the control plane's tests: a ``ControlStore`` on each backend (a SQLite
file in the test's folder; a fresh database of the machine's PostgreSQL, which FAILS under
CI when unreachable: tests/fixtures/postgres_server.py) over a fake clock."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from core.clock import FakeClock
from policies.control import ControlStore
from policies.control.postgres import PostgresDatabase
from policies.control.sqlite import SqliteDatabase
from tests.fixtures.postgres_server import pg_dsn, shared_postgres  # noqa: F401

BACKENDS = ["sqlite", "postgres"]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_store(backend: str, request: pytest.FixtureRequest, tmp_path, clock: FakeClock):
    """``make_store()``: another (unopened) ``ControlStore`` on the same database."""
    dsn = request.getfixturevalue("pg_dsn") if backend == "postgres" else None
    made: list[ControlStore] = []

    def make() -> ControlStore:
        if dsn is not None:
            database = PostgresDatabase(dsn, timeout_s=5)
        else:
            database = SqliteDatabase(tmp_path / "control.sqlite3")
        store = ControlStore(database, clock)
        made.append(store)
        return store

    make.made = made  # type: ignore[attr-defined]
    return make


@pytest.fixture
async def store(make_store) -> AsyncIterator[ControlStore]:
    """An opened store on the test's backend; closed (with any other made) afterwards."""
    first = make_store()
    await first.open()
    try:
        yield first
    finally:
        for each in make_store.made:
            await each.aclose()
