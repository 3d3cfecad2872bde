"""Who is calling, and may they do this: request headers -> ``Principal``; model and admin
checks. Built from one config snapshot (a hot reload builds a new one).

Credentials, in order: the admin key (``auth.admin_key_env``) -> ``ADMIN``; on an open
gateway (no tenants) anything else, or nothing -> ``OPEN``; a token shaped like a JWT (three
base64url parts joined by dots) -> the JWT path; anything else -> the API-key path. Tokens
come from ``Authorization: Bearer X`` or, for Anthropic-style clients, ``x-api-key: X``.

Failures are ``AuthenticationError`` (401) with OpenAI-like messages that do not say which
part was wrong (unknown key id, wrong secret, revoked, tenant gone all read the same). For
JWTs the precise reason rides on the error's ``__cause__`` (a ``TokenRejected``), for logs.

With JWT keys fetched from the identity provider (``auth.jwt.jwks_url`` or ``discovery``) the
authenticator owns a ``JwksSource``: ``start`` it, ``aclose`` it, and await ``prepare`` before
``authenticate`` so that a token signed with a key the IdP just published verifies on its
first use. ``authenticate`` itself stays synchronous and never waits on the network.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import structlog

from core.clock import Clock
from core.config import Config, ConfigError, relative_to_config
from core.config_tenants import TenantConfig
from core.errors import AuthenticationError, PermissionDeniedError
from core.tenancy import ADMIN, OPEN, Principal
from policies.auth.jwks import JwksSource
from policies.auth.jwt_verifier import JwtVerifier, TokenRejected, load_verification_keys
from policies.auth.keys import KeyIndex, KeysFileError

_log = structlog.get_logger("switchyard.auth")

MISSING_CREDENTIAL = (
    "Missing bearer token: provide your API key in an Authorization header using Bearer "
    "auth (Authorization: Bearer YOUR_KEY)."
)
INCORRECT_KEY = "Incorrect API key provided."
INVALID_TOKEN = "Invalid or expired token."

_JWT_SHAPE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """Case-insensitive enough for both ASGI frameworks (lower-case keys) and plain dicts
    written by hand (``Authorization``, ``X-Api-Key``)."""
    value = headers.get(name)
    return value if value is not None else headers.get(name.title())


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The credential the client sent, or None: ``Authorization: Bearer X`` first (scheme
    case-insensitive), else ``x-api-key: X``. Another auth scheme counts as no credential."""
    authorization = _header(headers, "authorization")
    if authorization:
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token:
            return token
    api_key = _header(headers, "x-api-key")
    return api_key.strip() or None if api_key else None


class _ModelRule:
    """A tenant's model allow-list and deny-list, as sets (checked on every request)."""

    __slots__ = ("allowed", "denied")

    def __init__(self, tenant: TenantConfig) -> None:
        self.allowed = None if tenant.models is None else frozenset(tenant.models)
        self.denied = frozenset(tenant.deny_models)

    def permits(self, alias: str) -> bool:
        if alias in self.denied:
            return False
        return self.allowed is None or alias in self.allowed


class Authenticator:
    """Authenticates requests against one config snapshot. ``env`` supplies the admin key
    and the JWT secret (by the names the config gives); ``clock`` paces the keys file's
    re-reads and judges JWT times. Raises ``ConfigError`` when the keys file or the JWT key
    material is unusable. ``previous``: the authenticator this one replaces on a reload; its
    fetched JWT keys serve this one until its own first fetch succeeds (an IdP outage during
    a reload locks nobody out)."""

    def __init__(
        self,
        config: Config,
        env: Mapping[str, str],
        clock: Clock,
        *,
        previous: Authenticator | None = None,
        control_keys: Callable[[str], Principal | None] | None = None,
    ) -> None:
        auth = config.auth
        admin = env.get(auth.admin_key_env) if auth.admin_key_env else None
        self._admin_key = admin.encode() if admin else None
        self._open = config.open_access
        self._tenants = config.tenants
        self._rules = {name: _ModelRule(tenant) for name, tenant in config.tenants.items()}
        self._keys: KeyIndex | None = None
        self._jwt: JwtVerifier | None = None
        self._source: JwksSource | None = None
        # the control plane's keys (policies.control); the keys file is imported into it
        self._control_keys = control_keys
        if self._open:
            return  # no tenant to map keys or tokens to: only the admin key matters
        if auth.keys_file and control_keys is None:
            try:
                self._keys = KeyIndex(relative_to_config(config, auth.keys_file), clock)
            except KeysFileError as exc:
                raise ConfigError([f"auth.keys_file: {exc}"]) from exc
        if auth.jwt is not None:

            def resolve(path: str) -> Path:
                return relative_to_config(config, path)

            keys = load_verification_keys(auth.jwt, env, resolve)
            if auth.jwt.fetches_keys:
                seed = previous._source if previous is not None else None
                self._source = JwksSource(auth.jwt, clock, seed=seed)
                if auth.jwt.audience is None:
                    _log.warning("jwt.no_audience", jwks=self._source.location)
            self._jwt = JwtVerifier(auth.jwt, keys, config.tenants, clock, source=self._source)

    @property
    def fetches_keys(self) -> bool:
        """Whether JWT keys come from the identity provider (``prepare`` has work to do)."""
        return self._source is not None

    async def start(self) -> None:
        """Fetch the JWT keys once and keep them fresh in the background (no-op without
        ``jwks_url``/``discovery``). ``ConfigError`` when the identity provider's answer is
        unusable (discovery without ``jwks_uri``, not a JWKS) and no earlier keys exist."""
        if self._source is not None:
            await self._source.start()

    async def aclose(self) -> None:
        """Stop the key refresher and close its HTTP client (keys already fetched still
        verify tokens for requests in flight)."""
        if self._source is not None:
            await self._source.aclose()

    async def prepare(self, headers: Mapping[str, str]) -> None:
        """Await before ``authenticate``: a JWT whose ``kid`` is not among the fetched keys
        waits (bounded, rate-limited) for one refresh. Never raises."""
        token = bearer_token(headers)
        # a cheap shape test (not the regex): only routing, ``authenticate`` decides
        if self._jwt is not None and token is not None and token.count(".") == 2:
            await self._jwt.prepare(token)

    def authenticate(self, headers: Mapping[str, str]) -> Principal:
        """The caller behind these request headers; ``AuthenticationError`` (401) when the
        credential is missing or not valid (open gateways accept anything)."""
        token = bearer_token(headers)
        if token is not None and self._is_admin(token):
            return ADMIN
        if self._open:
            return OPEN
        if token is None:
            raise AuthenticationError(MISSING_CREDENTIAL)
        if _JWT_SHAPE.fullmatch(token):
            return self._from_jwt(token)
        return self._from_api_key(token)

    def _is_admin(self, token: str) -> bool:
        # constant-time: the comparison's duration must not reveal a matching prefix
        return self._admin_key is not None and hmac.compare_digest(token.encode(), self._admin_key)

    def _from_api_key(self, token: str) -> Principal:
        if self._control_keys is not None:
            principal = self._control_keys(token)
            if principal is None or principal.tenant not in self._tenants:
                raise AuthenticationError(INCORRECT_KEY)
            return principal
        record = self._keys.verify(token) if self._keys is not None else None
        if record is None or record.tenant not in self._tenants:
            raise AuthenticationError(INCORRECT_KEY)
        return Principal(tenant=record.tenant, key_id=record.key_id, via="api_key")

    def _from_jwt(self, token: str) -> Principal:
        if self._jwt is None:
            raise AuthenticationError(INVALID_TOKEN)
        try:
            return self._jwt.verify(token)
        except TokenRejected as exc:
            raise AuthenticationError(INVALID_TOKEN) from exc

    def authorize_model(self, principal: Principal, alias: str) -> None:
        """``PermissionDeniedError`` (403, param ``model``) unless the principal's tenant may
        use model ``alias``. Open and admin principals (no tenant) may use every model."""
        if not self.may_use(principal, alias):
            who = "This API key" if principal.models is not None else f"Tenant '{principal.tenant}'"
            raise PermissionDeniedError(
                f"{who} is not allowed to use model '{alias}'.",
                param="model",
                code="model_not_allowed",
            )

    def may_use(self, principal: Principal, alias: str) -> bool:
        """Whether ``authorize_model`` would let ``principal`` use ``alias``."""
        if principal.tenant is None:
            return True
        if principal.models is not None and alias not in principal.models:
            return False  # the key's own allow-list narrows the tenant's
        rule = self._rules.get(principal.tenant)
        return rule is not None and rule.permits(alias)

    def require_admin(self, principal: Principal) -> None:
        """``PermissionDeniedError`` (403) unless the caller presented the admin key."""
        if not principal.admin:
            raise PermissionDeniedError("This endpoint needs the admin key.", code="admin_only")

    def tenant_config(self, principal: Principal) -> TenantConfig | None:
        """The principal's tenant section, or None (open gateway, admin, unknown tenant)."""
        return self._tenants.get(principal.tenant) if principal.tenant is not None else None
