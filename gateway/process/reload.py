"""Hot reload of the policy file: validate the whole file, build a complete new runtime
snapshot, swap one reference. An invalid file is rejected with its key-path errors and the
old policy keeps serving; requests in flight finish on the snapshot they started with."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from pathlib import Path

import structlog

from core.config import Config, ConfigError, load_config
from gateway.process.state import GatewayState

_log = structlog.get_logger("switchyard")


class Reloader:
    """Reloads ``path`` on demand (``reload``) and when its content changes (``watch``)."""

    def __init__(self, state: GatewayState, path: str) -> None:
        self._state = state
        self._path = visible_path(Path(path))
        self._lock = state.rebuild_lock  # shared with rebuilds for API tenant changes
        self._digest = self._read_digest()
        # "applied" / "rejected" (invalid file) / "failed" (a provider could not start)
        self.outcomes: Counter[str] = Counter()
        self.last_applied_at: float | None = None  # Unix seconds

    def _read_digest(self) -> str | None:
        try:
            return hashlib.blake2b(self._path.read_bytes(), digest_size=16).hexdigest()
        except OSError:
            return None

    async def reload(self) -> list[str]:
        """Load, validate and swap. Returns the errors ([] when the new policy serves)."""
        async with self._lock:
            self._digest = self._read_digest()
            try:
                config = load_config(self._path)
            except ConfigError as exc:
                _log.error("config.reload_rejected", path=str(self._path), errors=exc.errors)
                self.outcomes["rejected"] += 1
                return exc.errors
            state = self._state
            _warn_restart_only(state.runtime.config, config)
            try:
                # plus the control plane's tenants
                runtime = state.build_runtime(state.effective(config), previous=state.runtime)
                await runtime.start()
            except Exception as exc:  # a provider that cannot start: keep the old policy
                _log.exception("config.reload_failed", path=str(self._path))
                self.outcomes["failed"] += 1
                return [f"(runtime): {type(exc).__name__}: {exc}"]
            await state.swap(runtime)
            state.base_config = config
            self.outcomes["applied"] += 1
            self.last_applied_at = time.time()
            return []

    async def watch(self, interval_s: float) -> None:
        """Poll the file's content every ``interval_s``; reload when it changed. Polling a
        digest (not mtime) also catches editors that replace the file by rename."""
        while True:
            await asyncio.sleep(interval_s)
            digest = await asyncio.to_thread(self._read_digest)
            if digest is not None and digest != self._digest:
                await self.reload()


def visible_path(path: Path) -> Path:
    """The name to watch for ``path`` (a resolved path, as ``Config.source`` is).

    A ConfigMap or Secret volume holds ``config.yaml -> ..data/config.yaml`` and
    ``..data -> ..<timestamp>/``; an update writes a new timestamped folder, swaps ``..data``
    and deletes the old folder. Resolving the symlinks pins that old folder, which then
    vanishes, so inside such a folder the visible name (``<volume>/config.yaml``) is
    returned instead; any other path is returned unchanged."""
    for folder in path.parents:
        if folder.name.startswith("..") and (folder.parent / "..data").is_symlink():
            return folder.parent / path.relative_to(folder)
    return path


def _warn_restart_only(old: Config, new: Config) -> None:
    """The store and the ledger are opened once per process: changes apply at restart."""
    sections = ("state", "ledger", "control")
    changed = [name for name in sections if getattr(old, name) != getattr(new, name)]
    if changed:
        _log.warning("config.restart_needed", sections=changed)
