"""Policy-file sections for tenants: identity (keys, JWTs, admin), limits, shared state,
prices and the usage ledger. Decoded by ``core.config``; see the README for examples."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct, field

PositiveFloat = Annotated[float, Meta(gt=0)]
NonNegativeFloat = Annotated[float, Meta(ge=0)]
PositiveInt = Annotated[int, Meta(ge=1)]
EnvName = Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Name = Annotated[str, Meta(min_length=1)]

JwtAlgorithm = Literal[
    "HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "ES256", "ES384", "ES512"
]
FailureMode = Literal["open", "closed"]


class _Strict(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    pass


class RedisConfig(_Strict, frozen=True):
    """Where shared state lives when ``state.backend`` is ``redis``. ``url_env`` names an
    environment variable holding the URL instead (a password stays out of the file)."""

    url: str = "redis://127.0.0.1:6379/0"
    url_env: EnvName | None = None
    key_prefix: str = "switchyard:"
    timeout_s: PositiveFloat = 0.25  # per command; a slower Redis counts as unreachable
    retry_interval_s: PositiveFloat = 1.0  # how long to stay on the fallback before retrying


class StateConfig(_Strict, frozen=True):
    """Quota counters, breaker state and caches: one process (memory) or shared (redis)."""

    backend: Literal["memory", "redis"] = "memory"
    redis: RedisConfig = RedisConfig()


class JwtConfig(_Strict, frozen=True):
    """Bearer JWTs. HS* use the secret in ``secret_env``; RS*/ES* use one source of public
    keys: ``public_key_file`` (PEM), ``jwks_file`` (a JWKS document, keys picked by ``kid``),
    ``jwks_url`` (a JWKS fetched and refreshed from the identity provider) or ``discovery``
    (the ``jwks_uri`` of ``{issuer}/.well-known/openid-configuration``). Contradictory
    settings are refused when the file is decoded (``__post_init__``)."""

    algorithms: Annotated[list[JwtAlgorithm], Meta(min_length=1)] = field(
        default_factory=lambda: ["RS256"]
    )
    secret_env: EnvName | None = None
    public_key_file: str | None = None
    jwks_file: str | None = None
    jwks_url: str | None = None
    discovery: bool = False
    issuer: str | None = None
    audience: str | None = None
    tenant_claim: Name = "tenant"
    key_id_claim: Name = "sub"
    leeway_s: NonNegativeFloat = 30.0  # clock skew allowed on exp, nbf and iat
    # Longer tokens are refused before any decoding or signature work. Identity-provider
    # tokens are well under 4 KiB; browsers and proxies cap whole headers near 8-16 KiB.
    max_token_bytes: PositiveInt = 16384
    # Fetched keys (jwks_url, discovery): refreshed after the IdP's Cache-Control max-age
    # (clamped to [jwks_cooldown_s, 1 day]), or after jwks_refresh_s when it sends none.
    jwks_refresh_s: PositiveFloat = 300.0
    # At most one fetch per cooldown for tokens whose kid is unknown: a flood of made-up
    # kids cannot hammer the IdP. Also the shortest refresh interval and retry delay.
    jwks_cooldown_s: PositiveFloat = 30.0
    # One whole fetch (discovery and JWKS); also the longest a token with an unknown kid
    # waits for it. Tokens with known kids never wait on the IdP.
    jwks_timeout_s: PositiveFloat = 2.0

    @property
    def fetches_keys(self) -> bool:
        """Whether public keys come from the identity provider over HTTP."""
        return self.jwks_url is not None or self.discovery

    def __post_init__(self) -> None:
        problem = _jwt_problem(self)
        if problem is not None:
            raise ValueError(problem)


def _is_http_url(url: str) -> bool:
    scheme, _, rest = url.partition("://")
    return scheme in ("http", "https") and bool(rest.split("/", 1)[0])


def _jwt_problem(config: JwtConfig) -> str | None:
    """Why these JWT settings contradict each other, or None."""
    if config.jwks_url is not None and config.discovery:
        return "give jwks_url or discovery (the jwks_uri the issuer publishes), not both"
    if config.discovery and config.issuer is None:
        return "discovery needs issuer (keys come from {issuer}/.well-known/openid-configuration)"
    return _fetched_keys_problem(config) if config.fetches_keys else None


def _fetched_keys_problem(config: JwtConfig) -> str | None:
    """What contradicts keys fetched from the identity provider, or None."""
    remote = "jwks_url" if config.jwks_url is not None else "discovery"
    files = [name for name in ("public_key_file", "jwks_file") if getattr(config, name)]
    if files:
        return f"{remote} and {' and '.join(files)} are two sources of public keys: keep one"
    hmac_algs = [alg for alg in config.algorithms if alg.startswith("HS")]
    if hmac_algs:
        return (
            f"{', '.join(hmac_algs)} cannot be allowed with {remote}: a JWKS holds public keys"
            " for RS*/ES*, and an HMAC secret beside it is a second, unrelated trust root"
        )
    url = config.jwks_url if config.jwks_url is not None else config.issuer or ""
    if not _is_http_url(url):
        return f"{'jwks_url' if config.jwks_url else 'issuer'} must be an http(s) URL: {url!r}"
    return None


class AuthConfig(_Strict, frozen=True):
    """``keys_file`` holds API-key hashes written by ``switchyard keys create`` (relative
    paths are relative to the policy file's folder)."""

    admin_key_env: EnvName | None = None
    keys_file: str | None = None
    jwt: JwtConfig | None = None


class Limits(_Strict, frozen=True):
    """Per-tenant or per-key limits; ``None`` = unlimited."""

    rpm: PositiveInt | None = None
    tpm: PositiveInt | None = None
    concurrency: PositiveInt | None = None
    usd_per_day: PositiveFloat | None = None
    usd_per_month: PositiveFloat | None = None


class TenantConfig(_Strict, frozen=True):
    """One internal customer. ``models`` is an allow-list of aliases (``None`` = all)."""

    limits: Limits = Limits()
    key_limits: Limits = Limits()  # applied to each of the tenant's keys on its own
    models: list[Name] | None = None
    deny_models: list[Name] = []
    providers: list[Name] | None = None  # targets' providers this tenant may reach (None: all)
    deny_providers: list[Name] = []
    local_only: bool = False  # data residency: never leaves the local tier
    weight: PositiveFloat = 1.0  # share of the admission queue when targets are saturated
    slo_ttft_ms: PositiveFloat | None = None
    on_store_failure: FailureMode = "open"


class LedgerConfig(_Strict, frozen=True):
    """Where usage rows are committed. ``auto``: a Redis Stream when ``state.backend`` is
    redis, else the SQLite file at ``path``. ``postgres`` (only when named): a table in the
    PostgreSQL database that ``dsn``, or the environment variable ``dsn_env`` names, points
    to (docs/ledger.md)."""

    backend: Literal["auto", "sqlite", "redis", "postgres"] = "auto"
    path: str = "switchyard-usage.sqlite3"
    stream_maxlen: PositiveInt | None = None  # None: the stream is never trimmed
    # Redis and Postgres backends: the local SQLite file where rows wait while the shared
    # backend is unreachable, replayed when it is back (relative paths start at the policy file).
    spool_path: str = "switchyard-ledger-spool.sqlite3"
    # Postgres backend only. The DSN (libpq "host=... dbname=..." or a postgresql:// URI),
    # inline or in the variable dsn_env names (keeps a password out of the file); one of them.
    dsn: str | None = None
    dsn_env: EnvName | None = None
    # Group commit: rows that arrive while a commit is in flight share the next INSERT (at
    # most batch_rows rows). max_wait_ms > 0 also makes the first row after a quiet spell wait
    # that long for company: fewer, larger commits at low load, for that much latency.
    batch_rows: Annotated[int, Meta(ge=1, le=10000)] = 500
    max_wait_ms: Annotated[float, Meta(ge=0, le=100)] = 0.0
    timeout_s: PositiveFloat = 2.0  # connect or commit; slower counts as unreachable (spool)
    retry_interval_s: PositiveFloat = 1.0  # after an outage, spool without trying this long


class Price(_Strict, frozen=True):
    """USD per million tokens, or for local targets an hourly cost over a measured
    throughput (``hourly_usd`` / (``tokens_per_s`` * 3600) per token, input and output)."""

    input_per_mtok: NonNegativeFloat | None = None
    output_per_mtok: NonNegativeFloat | None = None
    cached_input_per_mtok: NonNegativeFloat | None = None
    hourly_usd: NonNegativeFloat | None = None
    tokens_per_s: PositiveFloat | None = None

    def per_token(self) -> tuple[float, float, float]:
        """(input, output, cached input) USD per token."""
        if self.hourly_usd is not None and self.tokens_per_s:
            each = self.hourly_usd / (self.tokens_per_s * 3600.0)
            return each, each, each
        prompt = (self.input_per_mtok or 0.0) / 1e6
        output = (self.output_per_mtok or 0.0) / 1e6
        cached = self.cached_input_per_mtok
        return prompt, output, prompt if cached is None else cached / 1e6

    def problem(self) -> str | None:
        """Why this price is incomplete, or None."""
        hourly = self.hourly_usd is not None or self.tokens_per_s is not None
        per_token = self.input_per_mtok is not None or self.output_per_mtok is not None
        if hourly and per_token:
            return "give either per-token prices or hourly_usd with tokens_per_s, not both"
        if hourly and (self.hourly_usd is None or self.tokens_per_s is None):
            return "hourly_usd and tokens_per_s go together"
        return None
