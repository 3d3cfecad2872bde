"""Start fake upstreams and a real gateway (uvicorn on 127.0.0.1) for end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from core.config import parse_config
from gateway.app import create_app
from tests.fixtures.server import ServerThread, free_port


@dataclass
class Gateway:
    url: str
    app: Any

    @property
    def base_url(self) -> str:
        return self.url + "/v1"


@contextmanager
def running_gateway(config_yaml: str, env: dict[str, str]) -> Iterator[Gateway]:
    """A gateway serving ``config_yaml`` on a free loopback port until the block ends."""
    app = create_app(parse_config(config_yaml), env=env)
    server = ServerThread(app, port=free_port()).start()
    try:
        yield Gateway(server.url, app)
    finally:
        server.stop()


def closed_port_url() -> str:
    """A loopback URL nobody listens on (connection refused)."""
    return f"http://127.0.0.1:{free_port()}/v1"
