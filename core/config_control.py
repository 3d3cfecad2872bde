"""Policy-file section ``control:``: where API keys, API-managed tenants and the admin audit
log are kept (the control plane, docs/keys.md). Absent: no control plane; API keys come
only from ``auth.keys_file`` as before."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

PositiveFloat = Annotated[float, Meta(gt=0)]
EnvName = Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class ControlConfig(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``sqlite`` (one host: a file, relative paths start at the policy file's folder) or
    ``postgres`` (a fleet: ``dsn``, or ``dsn_env`` naming the variable that holds it, as a
    password belongs in the environment). Every replica polls the store's change counter
    every ``poll_interval_s``; a poll or reload slower than ``timeout_s`` counts as failed
    (the replica keeps its last good view and tries again)."""

    backend: Literal["sqlite", "postgres"] = "sqlite"
    path: str = "switchyard-control.sqlite3"
    dsn: str | None = None
    dsn_env: EnvName | None = None
    poll_interval_s: PositiveFloat = 0.25
    timeout_s: PositiveFloat = 2.0

    def __post_init__(self) -> None:
        if self.backend == "postgres" and not (self.dsn or self.dsn_env):
            raise ValueError("backend postgres needs `dsn` or `dsn_env`")
