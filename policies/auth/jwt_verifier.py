"""Bearer JWTs: signature, algorithm allow-list, times, issuer, audience, tenant.

Algorithm safety (RFC 8725 section 2.1): the token's ``alg`` header only *selects* among the
algorithms the config allows, and each family has its own key material: HS* verify with the
shared secret from ``secret_env`` and nothing else; RS*/ES* verify with a public key object
from ``public_key_file`` or ``jwks_file`` whose type must match the family. So ``alg: none``
is never accepted (it is not an allowed algorithm), and an HS256 token "signed" with the
RSA public key as an HMAC secret fails: HS256 is checked against the secret, never the PEM.
Keys fetched from the identity provider (``jwks_url``, ``discovery``) come from a
``JwksSource``; the config refuses HS* beside them, and a fetched key is only ever an RSA or
EC public key, so no JWK can serve as an HMAC secret.

Times come from the injected clock, not from pyjwt (which reads ``time`` itself): pyjwt
checks the signature, ``iss`` and ``aud``; ``exp`` (required), ``nbf`` and ``iat`` (a token
issued in the future is refused) are checked here against ``clock.wall()`` with
``leeway_s``. A token longer than ``max_token_bytes`` is refused before anything else.
Verified tokens are cached by their exact text until they expire (bounded LRU), so a client
that reuses a token pays for one signature check; a change of the fetched key set voids the
cached verdicts (a key the IdP dropped stops verifying at the next refresh).

``verify`` is synchronous and never waits on the network. ``prepare`` (async, before it) lets
a token whose ``kid`` the fetched set lacks wait for one rate-limited refresh.
"""

from __future__ import annotations

import base64
import json
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from core.clock import Clock
from core.config import ConfigError
from core.config_tenants import JwtConfig
from core.tenancy import Principal
from policies.auth.jwks import JwkEntry, JwksSource, PublicKey, public_key_of

# RFC 7518 section 3.2: an HMAC key must be at least as long as the hash output.
_HMAC_MIN_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
# RFC 7518 section 3.4: each ES* algorithm names its curve.
_EC_CURVES = {"ES256": "secp256r1", "ES384": "secp384r1", "ES512": "secp521r1"}


class TokenRejected(Exception):
    """A JWT was refused. ``reason`` is for logs and tests, never for the caller (the
    client only learns "Invalid or expired token")."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class VerificationKeys:
    """Key material, loaded once: the HMAC secret, a PEM public key, JWKS keys by kid
    (a JWK without ``kid`` is filed under None)."""

    secret: bytes | None = None
    public_key: PublicKey | None = None
    jwks: Mapping[str | None, JwkEntry] = field(default_factory=dict)


def _public(key: Any, where: str) -> PublicKey:
    """The public half of an RSA or EC key (a JWKS may carry private members too)."""
    try:
        return public_key_of(key, where)
    except ValueError as exc:
        raise ConfigError([str(exc)]) from exc


def _load_pem(path: Path) -> PublicKey:
    where = "auth.jwt.public_key_file"
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except OSError as exc:
        raise ConfigError([f"{where}: cannot read {path}: {exc.strerror}"]) from exc
    except ValueError as exc:
        raise ConfigError([f"{where}: {path} is not a PEM public key"]) from exc
    return _public(key, where)


def _load_jwks(path: Path) -> dict[str | None, JwkEntry]:
    # Strict, unlike a fetched JWKS (jwks.parse_jwks skips odd keys): the operator wrote this
    # file, and a key in it that cannot be used is a mistake to report at start.
    where = "auth.jwt.jwks_file"
    try:
        document = json.loads(path.read_bytes())
        entries = document["keys"]
        keys = {
            entry.get("kid"): JwkEntry(_public(jwt.PyJWK(entry).key, where), entry.get("alg"))
            for entry in entries
            if entry.get("use", "sig") == "sig"
        }
    except OSError as exc:
        raise ConfigError([f"{where}: cannot read {path}: {exc.strerror}"]) from exc
    except (ValueError, KeyError, TypeError, AttributeError, jwt.PyJWTError) as exc:
        raise ConfigError([f"{where}: {path} is not a usable JWKS document: {exc}"]) from exc
    if not keys:
        raise ConfigError([f"{where}: {path} holds no signing keys"])
    return keys


def _load_secret(config: JwtConfig, env: Mapping[str, str], errors: list[str]) -> bytes | None:
    hmac_algs = [alg for alg in config.algorithms if alg.startswith("HS")]
    if not hmac_algs:
        return None
    if config.secret_env is None:
        errors.append(f"auth.jwt.secret_env: needed for {', '.join(hmac_algs)}")
        return None
    secret = env.get(config.secret_env, "").encode()
    need = max(_HMAC_MIN_BYTES[alg] for alg in hmac_algs)
    if len(secret) < need:
        errors.append(
            f"auth.jwt.secret_env: ${config.secret_env} must hold at least {need} bytes"
            f" (it holds {len(secret)})"
        )
        return None
    return secret


def load_verification_keys(
    config: JwtConfig, env: Mapping[str, str], resolve: Callable[[str], Path]
) -> VerificationKeys:
    """Read the key material ``config`` names (``resolve`` turns file names into paths).
    Raises ``ConfigError`` listing each problem: an HS* algorithm without a long enough
    secret, an RS*/ES* algorithm without a public key, an unreadable key file."""
    errors: list[str] = []
    secret = _load_secret(config, env, errors)
    public_key = jwks = None
    try:
        if config.public_key_file:
            public_key = _load_pem(resolve(config.public_key_file))
        if config.jwks_file:
            jwks = _load_jwks(resolve(config.jwks_file))
    except ConfigError as exc:
        errors.extend(exc.errors)
    asymmetric = [alg for alg in config.algorithms if not alg.startswith("HS")]
    if asymmetric and not (config.public_key_file or config.jwks_file or config.fetches_keys):
        errors.append(
            f"auth.jwt: {', '.join(asymmetric)} needs public_key_file or jwks_file"
            " (or jwks_url, or discovery with issuer)"
        )
    if errors:
        raise ConfigError(errors)
    return VerificationKeys(secret=secret, public_key=public_key, jwks=jwks or {})


def _fits(alg: str, key: PublicKey) -> bool:
    """Whether ``key`` is the right kind of key for ``alg`` (RSA for RS*, the named curve
    for ES*)."""
    if alg.startswith("RS"):
        return isinstance(key, rsa.RSAPublicKey)
    return isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == _EC_CURVES[alg]


def _unverified_json(part: str) -> dict[str, Any]:
    """One base64url JSON part of a token, unverified; {} when it is not a JSON object.
    On every uncached request with fetched keys: a few microseconds, where pyjwt's
    get_unverified_header (which decodes the whole token) took ~70 us here."""
    try:
        value = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except ValueError:  # binascii.Error, JSONDecodeError and UnicodeDecodeError included
        return {}
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


class JwtVerifier:
    """Turns a bearer JWT into a ``Principal(tenant, key_id="jwt:<sub>", via="jwt")`` or
    raises ``TokenRejected``. ``tenants`` are the configured tenant names; a token naming
    any other tenant is refused. ``source``: public keys fetched from the identity provider
    (then ``keys`` holds no public key material)."""

    def __init__(
        self,
        config: JwtConfig,
        keys: VerificationKeys,
        tenants: Collection[str],
        clock: Clock,
        *,
        source: JwksSource | None = None,
        cache_size: int = 4096,
    ) -> None:
        self._config = config
        self._keys = keys
        self._source = source
        self._tenants = frozenset(tenants)
        self._clock = clock
        # token -> (principal, exp, the generation of the key set that verified it)
        self._cache: OrderedDict[str, tuple[Principal, float, int]] = OrderedDict()
        self._cache_size = cache_size
        # an algorithm is usable only with its own family's key material
        asymmetric = keys.public_key is not None or bool(keys.jwks) or source is not None
        usable = {"HS": keys.secret is not None, "RS": asymmetric, "ES": asymmetric}
        self._algorithms = frozenset(alg for alg in config.algorithms if usable[alg[:2]])

    def verify(self, token: str) -> Principal:
        """The caller this token names; ``TokenRejected`` when it is not valid now."""
        if len(token) > self._config.max_token_bytes:
            # before the cache, base64 and the signature: size alone must not cost CPU
            # (header values are latin-1, one character per byte)
            raise TokenRejected(f"token larger than {self._config.max_token_bytes} bytes")
        # one snapshot of the fetched keys for the whole check (a refresh may swap them)
        fetched = self._source.keys if self._source is not None else None
        generation = fetched.generation if fetched is not None else 0
        cached = self._cache.get(token)
        if cached is not None:
            principal, expires, verified_by = cached
            if verified_by == generation and self._clock.wall() < expires + self._config.leeway_s:
                self._cache.move_to_end(token)
                return principal
            del self._cache[token]  # expired, or its key may have been dropped: check again
        jwks = fetched.keys if fetched is not None else self._keys.jwks
        claims = self._decode(token, jwks)
        expires = self._check_times(claims)
        principal = self._principal(claims)
        self._cache[token] = (principal, expires, generation)
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return principal

    async def prepare(self, token: str) -> None:
        """Before ``verify``, with fetched keys: a token whose ``kid`` the current set lacks
        waits (at most ``jwks_timeout_s``, rate-limited) for one refresh of the set. Never
        raises and never waits for a known kid: ``verify`` judges the token either way."""
        source = self._source
        if source is None or len(token) > self._config.max_token_bytes:
            return
        cached = self._cache.get(token)
        if cached is not None and cached[2] == source.keys.generation:
            return
        kid = self._unknown_kid(token, source.keys.keys)
        if kid is not None:
            await source.refresh_for(kid)

    def _unknown_kid(self, token: str, jwks: Mapping[str | None, JwkEntry]) -> str | None:
        """The token's ``kid`` if it is a string the set lacks and a refresh could help: an
        allowed algorithm and (with ``issuer`` set) the issuer's token. Unverified reads:
        they only decide whether to ask the IdP, never whether to accept."""
        head, _, rest = token.partition(".")
        header = _unverified_json(head)
        kid, alg = header.get("kid"), header.get("alg")
        if not isinstance(kid, str) or kid in jwks or alg not in self._algorithms:
            return None
        issuer = self._config.issuer
        if issuer is not None and _unverified_json(rest.partition(".")[0]).get("iss") != issuer:
            return None
        return kid

    def _decode(self, token: str, jwks: Mapping[str | None, JwkEntry]) -> dict[str, Any]:
        """Signature, ``iss`` and ``aud`` via pyjwt, with the key the header selects."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise TokenRejected(f"malformed token: {exc}") from exc
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self._algorithms:
            raise TokenRejected(f"algorithm {alg!r} is not allowed")
        key = self._key_for(alg, header.get("kid"), jwks)
        try:
            return jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=self._config.audience,
                issuer=self._config.issuer,
                options={
                    "require": ["exp"],
                    "verify_exp": False,  # checked against the injected clock instead
                    "verify_nbf": False,
                    "verify_iat": False,
                    "verify_aud": self._config.audience is not None,
                    "verify_iss": self._config.issuer is not None,
                    "enforce_minimum_key_length": True,
                },
            )
        except jwt.PyJWTError as exc:
            raise TokenRejected(f"{type(exc).__name__}: {exc}") from exc

    def _key_for(
        self, alg: str, kid: Any, jwks: Mapping[str | None, JwkEntry]
    ) -> bytes | PublicKey:
        if alg.startswith("HS"):
            assert self._keys.secret is not None  # HS* is allowed only with a secret
            return self._keys.secret
        entry = jwks.get(kid) if kid is None or isinstance(kid, str) else None
        if entry is None and kid is None and len(jwks) == 1 and self._keys.public_key is None:
            entry = next(iter(jwks.values()))
        if entry is not None:
            if entry.alg is not None and entry.alg != alg:
                raise TokenRejected(f"key {kid!r} is for {entry.alg}, not {alg}")
            key = entry.key
        elif self._keys.public_key is not None:
            key = self._keys.public_key
        else:
            raise TokenRejected(f"no key with kid {kid!r}")
        if not _fits(alg, key):
            raise TokenRejected(f"the key for {alg} is of the wrong type")
        return key

    def _check_times(self, claims: Mapping[str, Any]) -> float:
        """Check ``exp``, ``nbf`` and ``iat`` against the clock; return ``exp``."""
        now, leeway = self._clock.wall(), self._config.leeway_s
        exp, nbf, iat = claims.get("exp"), claims.get("nbf"), claims.get("iat")
        if not _number(exp):
            raise TokenRejected("exp must be a number")
        if now >= exp + leeway:
            raise TokenRejected("token expired")
        if nbf is not None and not _number(nbf):
            raise TokenRejected("nbf must be a number")
        if nbf is not None and now + leeway < nbf:
            raise TokenRejected("token not yet valid")
        if iat is not None and not _number(iat):
            raise TokenRejected("iat must be a number")
        if iat is not None and now + leeway < iat:
            # a token from the future: a skewed or compromised issuer (RFC 7519 4.1.6)
            raise TokenRejected("token issued in the future")
        return float(exp)

    def _principal(self, claims: Mapping[str, Any]) -> Principal:
        tenant = claims.get(self._config.tenant_claim)
        if not isinstance(tenant, str) or tenant not in self._tenants:
            raise TokenRejected(f"claim {self._config.tenant_claim!r} names no known tenant")
        subject = claims.get(self._config.key_id_claim)
        if not isinstance(subject, str) or not subject:
            # per-key limits and the ledger need a key id; a token without one is refused
            raise TokenRejected(f"claim {self._config.key_id_claim!r} is missing")
        return Principal(tenant=tenant, key_id=f"jwt:{subject}", via="jwt")
