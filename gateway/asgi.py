"""An app factory for ASGI servers started from the outside (granian, gunicorn+uvicorn):
``granian --interface asgi --factory gateway.asgi:app_from_env``. Reads $SWITCHYARD_CONFIG.

The connection fields of ``server:`` (header and keep-alive timeouts, header size, connection
cap, send timeout) apply only to ``switchyard serve`` (gateway/server.py): under another
server, set its own equivalents, or slow and idle clients hold connections without bound."""

from __future__ import annotations

import os

from litestar import Litestar

from core.config import load_config
from gateway.app import create_app
from gateway.process.observe import configure_logging


def app_from_env() -> Litestar:
    config = load_config(os.environ.get("SWITCHYARD_CONFIG", "config.yaml"))
    configure_logging(config.logging, redact=config.observability.redact)
    return create_app(config)
