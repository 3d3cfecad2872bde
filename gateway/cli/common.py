"""What every ``switchyard`` subcommand shares: where the policy file is."""

from __future__ import annotations

import os

DEFAULT_CONFIG = "config.yaml"
CONFIG_HELP = "policy file (default $SWITCHYARD_CONFIG or ./config.yaml)"


def config_path(value: str | None) -> str:
    """``--config``, else ``$SWITCHYARD_CONFIG``, else ``./config.yaml``."""
    return value or os.environ.get("SWITCHYARD_CONFIG") or DEFAULT_CONFIG
