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
    """Where shared state lives when ``state.backend`` is ``redis``."""

    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "switchyard:"
    timeout_s: PositiveFloat = 0.25  # per command; a slower Redis counts as unreachable
    retry_interval_s: PositiveFloat = 1.0  # how long to stay on the fallback before retrying


class StateConfig(_Strict, frozen=True):
    """Quota counters, breaker state and caches: one process (memory) or shared (redis)."""

    backend: Literal["memory", "redis"] = "memory"
    redis: RedisConfig = RedisConfig()


class JwtConfig(_Strict, frozen=True):
    """Bearer JWTs. HS* use the secret in ``secret_env``; RS*/ES* use ``public_key_file``
    (PEM) or ``jwks_file`` (a JWKS document, keys picked by ``kid``)."""

    algorithms: Annotated[list[JwtAlgorithm], Meta(min_length=1)] = field(
        default_factory=lambda: ["RS256"]
    )
    secret_env: EnvName | None = None
    public_key_file: str | None = None
    jwks_file: str | None = None
    issuer: str | None = None
    audience: str | None = None
    tenant_claim: Name = "tenant"
    key_id_claim: Name = "sub"
    leeway_s: NonNegativeFloat = 30.0  # clock skew allowed on exp, nbf and iat
    # Longer tokens are refused before any decoding or signature work. Identity-provider
    # tokens are well under 4 KiB; browsers and proxies cap whole headers near 8-16 KiB.
    max_token_bytes: PositiveInt = 16384


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
    redis, else the SQLite file at ``path``."""

    backend: Literal["auto", "sqlite", "redis"] = "auto"
    path: str = "switchyard-usage.sqlite3"
    stream_maxlen: PositiveInt | None = None  # None: the stream is never trimmed
    # Redis backend only: the local SQLite file where rows wait while Redis is unreachable,
    # replayed into the stream when it is back (relative paths start at the policy file).
    spool_path: str = "switchyard-ledger-spool.sqlite3"


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
