"""Structured logs: structlog configured once, and the one ``request.completed`` line."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import msgspec
import structlog

from core.config import LoggingConfig

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
# Keys whose values must never reach a log line.
_SECRET_KEYS = frozenset({"authorization", "api_key", "x-api-key", "x-goog-api-key", "password"})


def _drop_secrets(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in _SECRET_KEYS.intersection(event):
        event[key] = "[redacted]"
    return event


def _encode_line(event: Any, **_: Any) -> str:
    return msgspec.json.encode(event, enc_hook=str).decode()


def configure_logging(config: LoggingConfig, *, cache: bool = True) -> None:
    """JSON lines (or console when ``json: false``) on stdout, filtered at ``level``.

    ``cache=False`` keeps loggers re-reading the configuration (tests reconfigure it)."""
    # msgspec encodes a log line several times faster than the stdlib json module.
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_encode_line)
        if config.json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _drop_secrets,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[config.level]),
        logger_factory=structlog.WriteLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=cache,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
