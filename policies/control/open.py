"""Which database a ``control:`` section names."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from core.config_control import ControlConfig
from policies.control.database import Database
from policies.control.postgres import PostgresDatabase
from policies.control.sqlite import SqliteDatabase
from policies.pg import resolve_dsn


def open_database(
    control: ControlConfig, env: Mapping[str, str], resolve: Callable[[str], Path]
) -> Database:
    """The (not yet connected) database of ``control``; ``resolve`` turns a relative
    SQLite path into the policy file's folder. ``ConfigError`` when ``dsn_env`` names an
    unset variable (``policies.pg.resolve_dsn``)."""
    if control.backend == "sqlite":
        return SqliteDatabase(resolve(control.path))
    dsn = resolve_dsn(control.dsn, control.dsn_env, env, section="control")
    return PostgresDatabase(dsn, timeout_s=control.timeout_s)
