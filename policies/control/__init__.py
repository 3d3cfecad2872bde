"""The control plane: API keys, API-managed tenants and the admin audit log, kept durably
in a SQL store (SQLite or PostgreSQL) and mirrored in each replica's memory
(docs/decisions/0012-control-plane.md, docs/keys.md)."""

from policies.control.database import Database, SchemaTooNewError, migrate
from policies.control.errors import ConflictError, ControlUnavailableError, NotFoundError
from policies.control.index import ControlIndex, ControlRefresher, tags_json
from policies.control.open import open_database
from policies.control.records import AuditRecord, KeyRecord, TenantRecord, public_view
from policies.control.requests import Catalog, CreateKey, RotateKey, UpdateKey
from policies.control.service import ControlPlane
from policies.control.store import ControlStore, Snapshot

__all__ = [
    "AuditRecord",
    "Catalog",
    "ConflictError",
    "ControlIndex",
    "ControlPlane",
    "ControlRefresher",
    "ControlStore",
    "ControlUnavailableError",
    "CreateKey",
    "Database",
    "KeyRecord",
    "NotFoundError",
    "RotateKey",
    "SchemaTooNewError",
    "Snapshot",
    "TenantRecord",
    "UpdateKey",
    "migrate",
    "open_database",
    "public_view",
    "tags_json",
]
