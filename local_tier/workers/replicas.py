"""How worker replicas appear in the gateway's runtime, next to DNS-discovered ones
(local_tier/discovery.py): the runtime's ``replicas`` mapping holds, besides each DNS name's
addresses, ``managed_key(provider)`` -> the ``127.0.0.1:PORT`` of every ready worker of that
provider. Each address is one provider instance ``<provider>@127.0.0.1:PORT`` and its
targets are labelled ``<provider>@127.0.0.1:PORT/<model>``."""

from __future__ import annotations

import msgspec

from core.config import VllmProviderConfig
from local_tier.workers.launch import LOOPBACK

_PREFIX = "workers/"  # a "/" never appears in a DNS name: no clash with discovered names


def managed_key(provider: str) -> str:
    """The runtime ``replicas`` key under which ``provider``'s ready workers are listed."""
    return f"{_PREFIX}{provider}"


def worker_address(port: int) -> str:
    """The address (and replica name suffix) of the worker listening on ``port``."""
    return f"{LOOPBACK}:{port}"


def managed_replica_config(config: VllmProviderConfig, address: str) -> VllmProviderConfig:
    """The config of the worker replica at ``address`` (``host:port``): its own API and
    ``/metrics`` URLs; everything else is the provider's."""
    return msgspec.structs.replace(
        config, base_url=f"http://{address}/v1", metrics_url=None, discovery=None
    )
