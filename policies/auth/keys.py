"""API keys: generation, the keys file (write side, used by ``switchyard keys``) and the
index the gateway reads (re-read when the file changes, so a revocation reaches running
gateways within about a second, with no restart).

A key reads ``sy-<key_id>-<secret>``: ``key_id`` is 12 hex digits, public, used to find the
record and written to the usage ledger; ``secret`` is 32 random bytes, urlsafe base64. Only
the SHA-256 of the whole key is stored.

Why a plain SHA-256 and no password hash (bcrypt, scrypt, argon2): stretching exists to slow
down guessing of low-entropy human passwords. A key carries 256 random bits; nobody can
enumerate that space, stretched or not, so stretching would only cost CPU on every request
(the auth path has a budget of ~0.5 ms) for no security gain. The digest is compared with
``hmac.compare_digest`` so its comparison time says nothing about how much of it matched.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from core.clock import Clock

KEY_PREFIX = "sy-"
KEY_ID_BYTES = 6  # 12 hex digits: short enough to read aloud, unique among a team's keys
SECRET_BYTES = 32
FILE_VERSION = 1


class KeyRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One API key as stored: never the key itself, only its SHA-256 (hex). Times are
    Unix seconds; ``revoked_at`` None means the key is live."""

    key_id: str
    tenant: str
    name: str
    sha256: str
    created: float
    revoked_at: float | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


class _KeysDocument(msgspec.Struct, kw_only=True):
    version: int = FILE_VERSION
    keys: list[KeyRecord] = []


class KeysFileError(Exception):
    """The keys file cannot be read, parsed or written; the message names the path."""


_DECODER = msgspec.json.Decoder(_KeysDocument)
_ENCODER = msgspec.json.Encoder()


def hash_key(plaintext: str) -> str:
    """SHA-256 (hex) of the whole key, as stored in ``KeyRecord.sha256``."""
    return hashlib.sha256(plaintext.encode()).hexdigest()


def parse_key_id(plaintext: str) -> str | None:
    """The ``key_id`` part of ``sy-<key_id>-<secret>``, or None when the text is not in
    that shape. The key id is hex, so the first ``-`` after the prefix ends it (the secret
    may itself contain ``-``)."""
    if not plaintext.startswith(KEY_PREFIX):
        return None
    key_id, sep, secret = plaintext[len(KEY_PREFIX) :].partition("-")
    if not sep or not secret or len(key_id) != 2 * KEY_ID_BYTES:
        return None
    return key_id


def generate_key(
    tenant: str,
    name: str,
    *,
    created: float | None = None,
    token_bytes: Callable[[int], bytes] = secrets.token_bytes,
) -> tuple[str, KeyRecord]:
    """A new key for ``tenant``: (plaintext to hand out once, record to store).
    ``created`` defaults to the current Unix time; ``token_bytes`` is the randomness."""
    key_id = token_bytes(KEY_ID_BYTES).hex()
    secret = base64.urlsafe_b64encode(token_bytes(SECRET_BYTES)).rstrip(b"=").decode()
    plaintext = f"{KEY_PREFIX}{key_id}-{secret}"
    record = KeyRecord(
        key_id=key_id,
        tenant=tenant,
        name=name,
        sha256=hash_key(plaintext),
        created=time.time() if created is None else created,
    )
    return plaintext, record


def read_keys(path: Path) -> dict[str, KeyRecord]:
    """Records by key id. A missing file holds no keys (none created yet); an unreadable
    or malformed one raises ``KeysFileError``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise KeysFileError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        document = _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise KeysFileError(f"{path}: not a keys file: {exc}") from exc
    return {record.key_id: record for record in document.keys}


def _write_atomically(path: Path, records: list[KeyRecord]) -> None:
    """Write the whole file to a temp file in the same folder (mode 0600), fsync, then
    rename over ``path``: readers see the old file or the new one, never a torn write."""
    text = msgspec.json.format(_ENCODER.encode(_KeysDocument(keys=records)), indent=2)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(text + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class KeysFile:
    """Write side of the keys file: create, revoke, list. Each change is a locked
    read-modify-write (an advisory lock on ``<file>.lock``), so two ``switchyard keys``
    commands at once cannot lose each other's change."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, KeyRecord]]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise KeysFileError(f"{self.path}: cannot lock: {exc.strerror}") from exc
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield read_keys(self.path)
        finally:
            os.close(lock)  # closing releases the lock

    def _save(self, records: dict[str, KeyRecord]) -> None:
        try:
            _write_atomically(self.path, list(records.values()))
        except OSError as exc:
            raise KeysFileError(f"{self.path}: cannot write: {exc.strerror}") from exc

    def create(self, tenant: str, name: str, *, now: float | None = None) -> tuple[str, KeyRecord]:
        """Add a new key; return (plaintext, record). The plaintext exists only here."""
        with self._locked() as records:
            plaintext, record = generate_key(tenant, name, created=now)
            while record.key_id in records:  # 48-bit ids: a clash is rare, not impossible
                plaintext, record = generate_key(tenant, name, created=now)
            records[record.key_id] = record
            self._save(records)
        return plaintext, record

    def revoke(self, key_id: str, *, now: float | None = None) -> KeyRecord:
        """Mark ``key_id`` revoked (idempotent: the first revocation time is kept).
        Raises ``KeyError`` for an unknown id."""
        with self._locked() as records:
            record = records[key_id]
            if record.revoked_at is None:
                when = time.time() if now is None else now
                record = msgspec.structs.replace(record, revoked_at=when)
                records[key_id] = record
                self._save(records)
        return record

    def list_keys(self) -> list[KeyRecord]:
        """Every record, oldest first."""
        return sorted(read_keys(self.path).values(), key=lambda r: (r.created, r.key_id))


class KeyIndex:
    """Read side, for the gateway: verifies presented keys against the file's records.

    The file is stat'ed at most once per ``recheck_s`` of the injected clock (so the hot
    path costs a dict lookup and one SHA-256), and re-read when its (inode, mtime, size)
    changed. If a re-read fails (a hand edit gone wrong) the last good records stay in
    force and the next check tries again; at construction a bad file raises
    ``KeysFileError`` so the operator sees it at once.
    """

    def __init__(self, path: str | Path, clock: Clock, *, recheck_s: float = 1.0) -> None:
        self.path = Path(path)
        self._clock = clock
        self._recheck_s = recheck_s
        self._signature = self._stat()
        self._records = read_keys(self.path)
        self._checked_at = clock.now()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def refresh(self) -> None:
        """Re-read the file now if it changed since the last read."""
        self._checked_at = self._clock.now()
        signature = self._stat()
        if signature == self._signature:
            return
        try:
            self._records = read_keys(self.path)
        except KeysFileError:
            return  # keep serving the last good records; retry on the next check
        self._signature = signature

    def get(self, key_id: str) -> KeyRecord | None:
        """The record for ``key_id`` (revoked or not), after the periodic file check."""
        if self._clock.now() - self._checked_at >= self._recheck_s:
            self.refresh()
        return self._records.get(key_id)

    def verify(self, plaintext: str) -> KeyRecord | None:
        """The live record this key belongs to, or None (malformed, unknown, wrong secret
        or revoked)."""
        key_id = parse_key_id(plaintext)
        if key_id is None:
            return None
        record = self.get(key_id)
        if record is None or record.revoked:
            return None
        if not hmac.compare_digest(record.sha256, hash_key(plaintext)):
            return None
        return record
