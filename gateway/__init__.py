"""The Litestar app: routes, SSE, error rendering, lifespan and CLI. Nothing imports it."""

__version__ = "0.1.0"
