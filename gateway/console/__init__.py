"""The admin console: a web UI served by the gateway itself under ``/console``
(docs/console.md; the stack and why: docs/decisions/0013-console.md).

Server-rendered Jinja2 pages (autoescaped), htmx for the live parts, Chart.js for charts,
both vendored under ``static/vendor``; sessions in the shared store; CSRF checks on every
form; a strict Content-Security-Policy."""

from gateway.console.routes import console_router

__all__ = ["console_router"]
