"""The ``switchyard`` command line (``main``); one module per command group."""

from gateway.cli.main import main

__all__ = ["main"]
