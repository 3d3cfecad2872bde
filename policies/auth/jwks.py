"""Signing keys fetched from the identity provider: a JWKS URL, or the ``jwks_uri`` that
OIDC discovery (``{issuer}/.well-known/openid-configuration``) names.

Fetched with ``httpx.AsyncClient`` and parsed with pyjwt's ``PyJWK``, not with
``PyJWKClient``: that client does blocking ``urllib`` I/O and has neither a per-fetch deadline
nor a refetch rate limit; offloading it to a thread would still hold a thread per hung
fetch. Here every fetch runs on the event loop under one total deadline (``jwks_timeout_s``).

The request path never waits on the IdP for a key it knows: verification reads the current
``KeySet`` synchronously. A token with an unknown ``kid`` may wait (``refresh_for``) for one
fetch, shared by every such token and rate-limited by ``RefreshSchedule``; a background task
refreshes before the set's lifetime ends. A failed fetch keeps the known keys: a rotation
needs the IdP up, an outage does not lock anyone out.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import jwt
import structlog
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from core.clock import Clock
from core.config import ConfigError
from core.config_tenants import JwtConfig
from policies.auth.jwks_schedule import RefreshSchedule, max_age_of

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey

_log = structlog.get_logger("switchyard.auth")
MAX_DOCUMENT_BYTES = 1 << 20  # JWKS and discovery documents are a few KiB
DISCOVERY_PATH = "/.well-known/openid-configuration"


@dataclass(frozen=True)
class JwkEntry:
    key: PublicKey
    alg: str | None  # the JWK's own ``alg``, which then must equal the token's


@dataclass(frozen=True)
class KeySet:
    """Keys by ``kid`` (a JWK without one is filed under None). ``generation`` grows each
    time the set changes, so verified-token caches can tell their key may be gone."""

    keys: Mapping[str | None, JwkEntry] = field(default_factory=dict)
    generation: int = 0
    fingerprint: str = ""  # the canonical JSON of the JWKs it was built from


class JwksError(Exception):
    """A fetch failed. ``definitive``: the IdP answered, and the answer is unusable (wrong
    URL, not a JWKS, discovery without ``jwks_uri``); otherwise it may work next time."""

    def __init__(self, message: str, *, definitive: bool) -> None:
        super().__init__(message)
        self.definitive = definitive


def public_key_of(key: Any, where: str) -> PublicKey:
    """The public half of an RSA or EC key (a JWKS may carry private members too);
    ``ValueError`` for any other kind of key (``oct`` secrets, OKP)."""
    if isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        key = key.public_key()
    if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
        raise ValueError(f"{where}: expected an RSA or EC public key")
    return key


def parse_jwks(document: Any, where: str) -> tuple[dict[str | None, JwkEntry], list[str]]:
    """The signing keys of a JWKS document and the reasons others were skipped (encryption
    keys, symmetric or unsupported kinds). ``ValueError`` when the document has no ``keys``
    list."""
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{where}: not a JWKS document (no 'keys' list)")
    keys: dict[str | None, JwkEntry] = {}
    skipped: list[str] = []
    for entry in entries:
        kid = entry.get("kid") if isinstance(entry, dict) else None
        try:
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                raise ValueError("not a signing key")
            if kid is not None and not isinstance(kid, str):
                raise ValueError("kid is not a string")
            key = public_key_of(jwt.PyJWK(entry).key, where)
        except (ValueError, TypeError, KeyError, jwt.PyJWTError) as exc:
            skipped.append(f"kid {kid!r}: {exc}")
            continue
        keys[kid] = JwkEntry(key, entry.get("alg"))
    return keys, skipped


def _fingerprint(document: Mapping[str, Any]) -> str:
    return json.dumps(document.get("keys"), sort_keys=True, separators=(",", ":"))


class JwksSource:
    """The current signing keys of one identity provider (``config.jwks_url``, or discovery
    from ``config.issuer``). ``seed``: the source this one replaces on a reload; from the
    same place it hands over its keys, discovered URL and fetch timing, so a reload neither
    refetches fresh keys nor loses them while the IdP is down. ``start`` fetches (unless the
    seed's keys are still fresh) and starts the background refresher; ``aclose`` stops both
    and closes the HTTP client."""

    def __init__(
        self,
        config: JwtConfig,
        clock: Clock,
        *,
        seed: JwksSource | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._config = config
        self._timeout_s = config.jwks_timeout_s
        self._schedule = RefreshSchedule(
            clock, refresh_s=config.jwks_refresh_s, cooldown_s=config.jwks_cooldown_s
        )
        self._keys = KeySet()
        self._jwks_uri = config.jwks_url
        if seed is not None and seed.location == self.location:
            self._keys = seed._keys
            self._jwks_uri = self._jwks_uri or seed._jwks_uri
            if seed._schedule.settings == self._schedule.settings:
                self._schedule = seed._schedule  # one IdP, one timing (and rate limit)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._last_problem: JwksError | None = None
        self._reported: asyncio.Task[None] | None = None  # the fetch last logged as in vain
        self._closed = False

    @property
    def location(self) -> str:
        """Where the keys come from: the JWKS URL, or the discovery document's URL."""
        if self._config.jwks_url is not None:
            return self._config.jwks_url
        return f"{(self._config.issuer or '').rstrip('/')}{DISCOVERY_PATH}"

    @property
    def keys(self) -> KeySet:
        return self._keys

    async def start(self) -> None:
        """Fetch the keys (at most ``jwks_timeout_s``), then refresh them in the background.
        ``ConfigError`` when the IdP's answer is unusable and no earlier keys are at hand
        (the source is then closed); a transient failure is logged and retried later."""
        if self._closed or self._refresher is not None:
            return
        if not self._keys.keys or self._schedule.due_in() == 0:  # a seed's may still be fresh
            await asyncio.wait({self._refreshing or self._begin_refresh()})
        problem = self._last_problem
        if problem is not None and problem.definitive and not self._keys.keys:
            await self.aclose()
            raise ConfigError([f"auth.jwt: {problem}"])
        self._refresher = asyncio.create_task(self._refresh_loop())

    async def aclose(self) -> None:
        self._closed = True
        for task in (self._refresher, self._refreshing):
            if task is not None:
                task.cancel()
        for task in (self._refresher, self._refreshing):
            if task is not None:
                await asyncio.gather(task, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()

    async def refresh_for(self, kid: str) -> None:
        """Give a token whose ``kid`` is unknown its chance: join the fetch in flight, or
        start one if the cooldown allows, and wait for it (at most ``jwks_timeout_s``). Returns
        in any case; the caller then looks the kid up again."""
        if kid in self._keys.keys or self._closed:
            return
        task = self._refreshing
        if task is None:
            if not self._schedule.may_fetch_for_unknown_kid():
                return  # rate-limited: the token is refused with the keys at hand
            task = self._begin_refresh()
        # asyncio.wait, not wait_for: a cancelled fetch (reload, shutdown) must not read as
        # this request's cancellation, and this request leaving must not cancel the fetch.
        await asyncio.wait({task}, timeout=self._timeout_s)
        if kid not in self._keys.keys and self._reported is not task:
            self._reported = task  # one line per fetch, however many tokens waited on it
            _log.warning(
                "jwt.unknown_kid",
                kid=kid[:64],
                jwks=self.location,
                known=len(self._keys.keys),
                fetched=task.done(),
            )

    def _begin_refresh(self) -> asyncio.Task[None]:
        task = asyncio.create_task(self._refresh_task())
        self._refreshing = task
        task.add_done_callback(self._refresh_done)
        return task

    def _refresh_done(self, task: asyncio.Task[None]) -> None:
        if self._refreshing is task:
            self._refreshing = None

    async def _refresh_task(self) -> None:
        self._last_problem = await self._refresh_now()

    async def _refresh_now(self) -> JwksError | None:
        """One fetch; installs the new keys, or logs why not. Returns the failure."""
        self._schedule.started()
        try:
            async with asyncio.timeout(self._timeout_s):
                document, max_age = await self._fetch_jwks()
            keys, skipped = parse_jwks(document, self.location)
            if not keys:
                raise JwksError(f"no usable signing key ({'; '.join(skipped)})", definitive=True)
        except JwksError as exc:
            problem = exc
        except TimeoutError:
            problem = JwksError(f"no answer within {self._timeout_s} s", definitive=False)
        except httpx.HTTPError as exc:
            problem = JwksError(f"{type(exc).__name__}: {exc}", definitive=False)
        except ValueError as exc:
            problem = JwksError(str(exc), definitive=True)
        except Exception as exc:  # e.g. httpx.InvalidURL: never leave the schedule unset
            problem = JwksError(f"{type(exc).__name__}: {exc}", definitive=False)
        else:
            self._install(keys, _fingerprint(document), skipped)
            self._schedule.succeeded(max_age)
            return None
        retry_s = self._schedule.failed()
        if self._config.jwks_url is None:
            self._jwks_uri = None  # discover again next time: the IdP may have moved its JWKS
        _log.warning(
            "jwks.refresh_failed",
            jwks=self.location,
            error=str(problem),
            keeping=len(self._keys.keys),
            retry_in_s=retry_s,
        )
        return problem

    def _install(
        self, keys: dict[str | None, JwkEntry], fingerprint: str, skipped: list[str]
    ) -> None:
        old = self._keys
        if fingerprint == old.fingerprint:
            return
        self._keys = KeySet(keys, old.generation + 1, fingerprint)
        _log.info(
            "jwks.keys_changed",
            jwks=self.location,
            added=sorted(str(kid) for kid in keys.keys() - old.keys.keys()),
            removed=sorted(str(kid) for kid in old.keys.keys() - keys.keys()),
            skipped=skipped,
        )

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self._schedule.due_in())
            task = self._refreshing or self._begin_refresh()
            await asyncio.wait({task})

    async def _fetch_jwks(self) -> tuple[Any, float | None]:
        if self._jwks_uri is None:
            self._jwks_uri = await self._discover()
        return await self._get_json(self._jwks_uri)

    async def _discover(self) -> str:
        """The ``jwks_uri`` of the issuer's discovery document; its ``issuer`` must be the
        configured one exactly (OpenID Connect Discovery 1.0, section 4.3)."""
        document, _ = await self._get_json(self.location)
        issuer = document.get("issuer") if isinstance(document, dict) else None
        uri = document.get("jwks_uri") if isinstance(document, dict) else None
        if issuer != self._config.issuer:
            raise JwksError(
                f"{self.location} names issuer {issuer!r}, not {self._config.issuer!r}",
                definitive=True,
            )
        if not isinstance(uri, str) or not uri.startswith(("https://", "http://")):
            raise JwksError(f"{self.location} has no http(s) jwks_uri", definitive=True)
        return uri

    async def _get_json(self, url: str) -> tuple[Any, float | None]:
        """GET ``url`` as JSON (at most ``MAX_DOCUMENT_BYTES``), with its max-age."""
        async with self._http().stream("GET", url) as response:
            status = response.status_code
            if status != 200:
                # 5xx, 408 and 429 may pass; another status says the URL is wrong
                transient = status >= 500 or status in (408, 429)
                raise JwksError(f"{url} answered HTTP {status}", definitive=not transient)
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_DOCUMENT_BYTES:
                    raise JwksError(f"{url} sent over {MAX_DOCUMENT_BYTES} bytes", definitive=True)
            max_age = max_age_of(response.headers)
        try:
            return json.loads(body), max_age
        except ValueError as exc:
            raise JwksError(f"{url} did not send JSON: {exc}", definitive=True) from exc

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:  # created on first use: a source never started owns none
            self._client = httpx.AsyncClient(
                transport=self._transport,
                timeout=httpx.Timeout(self._timeout_s),
                follow_redirects=True,
                max_redirects=3,
                headers={"accept": "application/json"},
                trust_env=False,
            )
        return self._client
