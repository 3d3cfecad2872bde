"""Shared state: the ``Store`` protocol (``base``) and its backends, ``MemoryStore`` (one
process, in ``memory``) and ``RedisStore`` (any number of replicas, in ``redis``)."""

from policies.store.base import Script, Store, StoreUnavailableError, Value
from policies.store.memory import MemoryStore
from policies.store.redis import RedisStore

__all__ = [
    "MemoryStore",
    "RedisStore",
    "Script",
    "Store",
    "StoreUnavailableError",
    "Value",
]
