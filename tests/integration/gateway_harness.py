"""Start fake upstreams and a real gateway (uvicorn on 127.0.0.1) for end-to-end tests."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgspec

from core.config import Config, LedgerConfig, parse_config
from gateway.app import create_app
from tests.fixtures.server import ServerThread, free_port


@dataclass
class Gateway:
    url: str
    app: Any

    @property
    def base_url(self) -> str:
        return self.url + "/v1"


def with_private_ledger(config: Config) -> Config:
    """``config`` with its SQLite ledger (and Redis spool) in a fresh temporary folder when
    the text left the default relative paths (tests must not write into the working
    directory)."""
    default = LedgerConfig()
    changes: dict[str, str] = {}
    folder = tempfile.mkdtemp(prefix="switchyard-ledger-")
    if config.ledger.path == default.path:
        changes["path"] = f"{folder}/usage.sqlite3"
    if config.ledger.spool_path == default.spool_path:
        changes["spool_path"] = f"{folder}/spool.sqlite3"
    if not changes:
        return config
    ledger = msgspec.structs.replace(config.ledger, **changes)
    return msgspec.structs.replace(config, ledger=ledger)


@contextmanager
def running_gateway(config_yaml: str, env: dict[str, str]) -> Iterator[Gateway]:
    """A gateway serving ``config_yaml`` on a free loopback port until the block ends."""
    app = create_app(with_private_ledger(parse_config(config_yaml)), env=env)
    server = ServerThread(app, port=free_port()).start()
    try:
        yield Gateway(server.url, app)
    finally:
        server.stop()


def closed_port_url() -> str:
    """A loopback URL nobody listens on (connection refused)."""
    return f"http://127.0.0.1:{free_port()}/v1"
