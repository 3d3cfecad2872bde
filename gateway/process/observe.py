"""Structured logs: structlog configured once, and the one ``request.completed`` line.

Secrets never reach a line: values under secret-named keys are replaced, and free text
(messages, errors, exception text, any long string) is passed through ``Redactor`` (e-mail
addresses, API-key-like strings, the operator's ``observability.redact`` patterns). The
gateway never logs prompts or completions; redaction is the net under that rule.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any

import msgspec
import structlog

from core.config import LoggingConfig
from gateway.process.redact import Redactor

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
# Keys whose values must never reach a log line.
_SECRET_KEYS = frozenset({"authorization", "api_key", "x-api-key", "x-goog-api-key", "password"})


def _drop_secrets(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in _SECRET_KEYS.intersection(event):
        event[key] = "[redacted]"
    return event


# Keys whose values are free text (messages, errors, tracebacks): always redacted. Other
# string values are redacted only when longer than ``_LONG_VALUE``: ids, names and codes
# are shorter, and skipping them keeps the pass at ~2 µs on a ``request.completed`` line.
_FREE_TEXT = frozenset(
    {"event", "message", "msg", "detail", "error", "errors", "exception", "reason", "stack"}
)
_LONG_VALUE = 64


class _Redacting:
    """The structlog processor that redacts the free text of an event, in place."""

    __slots__ = ("_redact",)

    def __init__(self, redactor: Redactor) -> None:
        self._redact = redactor.redact

    def __call__(
        self, _: Any, __: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        for key, value in event.items():
            if type(value) is str:
                if len(value) > _LONG_VALUE or key in _FREE_TEXT:
                    event[key] = self._redact(value)
            elif key in _FREE_TEXT and value is not None:
                event[key] = self._free_text(value)
        return event

    def _free_text(self, value: Any) -> Any:
        """A non-string free-text value: a list keeps its shape (its strings redacted);
        anything else (an exception object, say) becomes its redacted text, as the
        renderer would have written it."""
        if isinstance(value, list | tuple):
            return [self._redact(item) if isinstance(item, str) else item for item in value]
        if isinstance(value, bool | int | float):
            return value
        return self._redact(str(value))


def _encode_line(event: Any, **_: Any) -> str:
    return msgspec.json.encode(event, enc_hook=str).decode()


def configure_logging(
    config: LoggingConfig, *, cache: bool = True, redact: Iterable[str] = ()
) -> None:
    """JSON lines (or console when ``json: false``) on stdout, filtered at ``level``.

    ``redact``: extra patterns (``observability.redact``) on top of the built-in ones.
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
            _Redacting(Redactor(redact)),  # after format_exc_info: tracebacks are text too
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[config.level]),
        logger_factory=structlog.WriteLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=cache,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
