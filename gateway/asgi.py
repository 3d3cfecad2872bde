"""An app factory for ASGI servers started from the outside (granian, gunicorn+uvicorn):
``granian --interface asgi --factory gateway.asgi:app_from_env``. Reads $SWITCHYARD_CONFIG."""

from __future__ import annotations

import os

from litestar import Litestar

from core.config import load_config
from gateway.app import create_app
from gateway.observe import configure_logging


def app_from_env() -> Litestar:
    config = load_config(os.environ.get("SWITCHYARD_CONFIG", "config.yaml"))
    configure_logging(config.logging)
    return create_app(config)
