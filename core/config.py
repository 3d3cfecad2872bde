"""The policy file's schema and its phased loader.

Phases: YAML -> each section decoded on its own (so one run reports every error, each with its
key path, e.g. ``providers.claude.timeout_s: Expected `float` > 0.0, got 0``) -> references
checked. Secrets are named by environment variable, never written in the file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from core.config_batch import BatchConfig
from core.config_control import ControlConfig
from core.config_discovery import DiscoveryConfig, discovery_problem
from core.config_idempotency import IdempotencyConfig
from core.config_observability import ObservabilityConfig
from core.config_routing import (
    BreakerConfig,
    PriorityStrategy,
    PromptCacheConfig,
    QueueConfig,
    ResponseCacheConfig,
    RetryBudgetConfig,
    SaturationConfig,
    StrategyConfig,
    expand_strategy_shorthand,
    strategy_hint,
)
from core.config_tenants import AuthConfig, LedgerConfig, Price, StateConfig, TenantConfig
from core.config_workers import WorkerConfig, worker_problems

PositiveFloat = Annotated[float, Meta(gt=0)]
PositiveInt = Annotated[int, Meta(ge=1)]
EnvName = Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Name = Annotated[str, Meta(min_length=1)]


class _Strict(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    pass


class ProviderBase(_Strict, frozen=True):
    """Fields every provider kind has."""

    api_key_env: EnvName | None = None
    timeout_s: PositiveFloat = 600.0
    connect_timeout_s: PositiveFloat = 5.0
    first_token_timeout_s: PositiveFloat = 60.0
    stream_idle_timeout_s: PositiveFloat = 60.0  # longest gap between two streamed chunks
    headers: dict[str, str] = {}
    local: bool = False  # data residency: True for the team's own hardware


class OpenAIProviderConfig(ProviderBase, tag="openai", tag_field="type", frozen=True):
    """Any OpenAI-compatible API (OpenAI, Groq, Together, Mistral, DeepSeek, Ollama, vLLM)."""

    base_url: str = "https://api.openai.com/v1"
    # Whether the API serves OpenAI's Responses API (``POST /responses``): then requests to
    # the gateway's /v1/responses are passed through to it. None = auto: only OpenAI's own
    # base_url (Groq, Together, vLLM and other compatibles vary).
    responses_api: bool | None = None
    # Batches whose requests all go to this provider run through its Batch API (OpenAI's
    # ``/v1/files`` + ``/v1/batches``) instead of one request at a time (docs/batches.md).
    batch_api: bool = False


class VllmProviderConfig(ProviderBase, tag="vllm", tag_field="type", frozen=True):
    """A local-tier worker with vLLM's HTTP API: ``vllm serve`` or ``switchyard worker jax``.
    Its ``/metrics`` feed saturation (spill-over) and prefix-aware routing."""

    base_url: str = "http://127.0.0.1:8000/v1"
    metrics_url: str | None = None  # default: base_url without /v1, plus /metrics
    # which server it is: the Prometheus names its /metrics page uses (local_tier/engines)
    engine: Literal["vllm", "sglang", "tgi", "trtllm", "llamacpp", "jax"] = "vllm"
    local: bool = True
    saturation: SaturationConfig = SaturationConfig()
    # The worker's KV block size in tokens, until its /metrics says (cache_config_info):
    # prefix-aware routing counts a prompt's matched prefix in whole blocks of it.
    block_size: PositiveInt = 16
    # The worker schedules by vLLM's ``priority`` field (``vllm serve --scheduling-policy
    # priority``, or ``switchyard worker jax``): batch items are sent at priority 1, so the
    # worker pauses them while interactive requests run. Off: vLLM refuses the field.
    priority_scheduling: bool = False
    # base_url's host is a DNS name whose A/AAAA records are the replicas (None: one URL)
    discovery: DiscoveryConfig | None = None

    def __post_init__(self) -> None:
        problem = discovery_problem(self.base_url, self.metrics_url) if self.discovery else None
        if problem:
            raise ValueError(problem)


class AnthropicProviderConfig(ProviderBase, tag="anthropic", tag_field="type", frozen=True):
    base_url: str = "https://api.anthropic.com"
    anthropic_version: str = "2023-06-01"
    default_max_tokens: PositiveInt = 4096
    batch_api: bool = False  # batches for this provider use its Message Batches API


class GeminiProviderConfig(ProviderBase, tag="gemini", tag_field="type", frozen=True):
    base_url: str = "https://generativelanguage.googleapis.com"
    api_version: str = "v1beta"


class JaxProviderConfig(ProviderBase, tag="jax", tag_field="type", frozen=True):
    """The in-process JAX engine. ``model_path``: a GGUF file or a Hugging Face model
    folder; None means the bundled SmolLM2-135M."""

    local: bool = True
    model_path: str | None = None
    served_model_name: str = "smollm2-135m-instruct"
    dtype: Literal["float32", "bfloat16", "int8"] = "float32"
    backend: Literal["auto", "cpu", "gpu", "tpu"] = "auto"
    tensor_parallel: PositiveInt = 1  # devices one model copy is split over
    data_parallel: PositiveInt = 1  # model copies (each on tensor_parallel devices)
    max_batch_size: PositiveInt = 8
    max_model_len: PositiveInt = 2048
    kv_cache_tokens: PositiveInt = 32768
    # Share of the device's memory for weights, activations and KV cache; the cache gets what
    # is left (replaces kv_cache_tokens; vLLM's --gpu-memory-utilization). None = off.
    kv_cache_fraction: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    attention: Literal["auto", "xla", "pallas"] = "auto"  # decode attention kernel
    block_size: PositiveInt = 16
    compile_cache_dir: str | None = None


ProviderConfig = (
    OpenAIProviderConfig
    | VllmProviderConfig
    | AnthropicProviderConfig
    | GeminiProviderConfig
    | JaxProviderConfig
)


class TargetConfig(_Strict, frozen=True):
    provider: Name
    model: Name
    weight: Annotated[float, Meta(ge=0)] = 1.0  # for the weighted strategy
    price: Price | None = None
    max_context: PositiveInt | None = None  # tokens; default: what the provider reports


class ModelConfig(_Strict, frozen=True):
    targets: Annotated[list[TargetConfig], Meta(min_length=1)]
    description: str | None = None
    owned_by: str = "switchyard"
    strategy: StrategyConfig = PriorityStrategy()
    slo_ttft_ms: PositiveFloat | None = None
    slo_total_ms: PositiveFloat | None = None
    queue_deadline_s: PositiveFloat | None = None


class ServerConfig(_Strict, frozen=True):
    """The HTTP server. The connection fields (from ``header_timeout_s`` on) are read once
    at start by ``switchyard serve`` (gateway/server.py); a reload does not change them."""

    max_body_bytes: PositiveInt = 8 * 1024 * 1024
    watch_config: bool = True  # reload the policy file when it changes
    watch_interval_s: PositiveFloat = 1.0
    drain_timeout_s: PositiveFloat = 30.0  # graceful shutdown waits this long for requests
    # Total time from a connection's open (or a request's first byte) to the end of the
    # request's headers: a socket that sends nothing, or a header line every few seconds,
    # is closed (408 if it had begun a request).
    header_timeout_s: PositiveFloat = 10.0
    # Idle time allowed between two requests on one connection; longer than the 5 s after
    # which httpx (the OpenAI SDK) stops reusing a pooled connection, so that the server is
    # never the side that closes a connection the client is about to reuse.
    keep_alive_timeout_s: PositiveFloat = 15.0
    # How long a response write may stay blocked by a client that does not read; then the
    # connection is aborted and the request ends as a disconnect (499), freeing its slot.
    send_timeout_s: PositiveFloat = 30.0
    max_header_bytes: PositiveInt = 32 * 1024  # request line + headers; 431 above it
    max_connections: PositiveInt = 1000  # open connections; one more gets 503 and is closed
    backlog: PositiveInt = 2048  # the listening socket's accept queue


class RoutingConfig(_Strict, frozen=True):
    """How the executor treats targets: retries, breakers, the queue, provider caches."""

    max_attempts_per_target: PositiveInt = 2
    retry_backoff_s: Annotated[float, Meta(ge=0)] = 0.05
    max_retry_after_s: Annotated[float, Meta(ge=0)] = 2.0
    # the most Retry-After the gateway passes on to clients from its upstreams (seconds)
    max_client_retry_after_s: Annotated[float, Meta(gt=0)] = 60.0
    # most answers one chat request may ask for (``n``); each is reserved in the quota
    max_n: PositiveInt = 128
    retry_budget: RetryBudgetConfig = RetryBudgetConfig()
    breaker: BreakerConfig = BreakerConfig()
    queue: QueueConfig = QueueConfig()
    prompt_cache: PromptCacheConfig = PromptCacheConfig()


class LoggingConfig(_Strict, frozen=True):
    level: Literal["debug", "info", "warning", "error"] = "info"
    json: bool = True


class Config(_Strict, frozen=True):
    providers: dict[str, ProviderConfig] = {}
    models: dict[str, ModelConfig] = {}
    tenants: dict[str, TenantConfig] = {}
    server: ServerConfig = ServerConfig()
    routing: RoutingConfig = RoutingConfig()
    logging: LoggingConfig = LoggingConfig()
    state: StateConfig = StateConfig()
    auth: AuthConfig = AuthConfig()
    ledger: LedgerConfig = LedgerConfig()
    response_cache: ResponseCacheConfig = ResponseCacheConfig()
    observability: ObservabilityConfig = ObservabilityConfig()
    idempotency: IdempotencyConfig = IdempotencyConfig()
    batch: BatchConfig = BatchConfig()
    control: ControlConfig | None = None  # None: no control plane (keys file only)
    workers: dict[str, WorkerConfig] = {}  # processes `serve` runs itself (core/config_workers)
    source: str | None = None  # the file it was loaded from (set by load_config)

    @property
    def open_access(self) -> bool:
        """No tenants configured: anyone may call (the embedded default)."""
        return not self.tenants


class ConfigError(Exception):
    """The file is invalid; ``errors`` lists every problem, each led by its key path."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("invalid config:\n  " + "\n  ".join(errors))
        self.errors = errors


_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_SECTIONS = {
    "server": ServerConfig,
    "routing": RoutingConfig,
    "logging": LoggingConfig,
    "state": StateConfig,
    "auth": AuthConfig,
    "ledger": LedgerConfig,
    "response_cache": ResponseCacheConfig,
    "observability": ObservabilityConfig,
    "idempotency": IdempotencyConfig,
    "batch": BatchConfig,
}
_OPTIONAL_SECTIONS = {"control": ControlConfig}  # absent stays None


def _keyed(prefix: str, error: msgspec.ValidationError) -> str:
    """Turn msgspec's ``msg - at `$.a[0].b``` into ``prefix.a[0].b: msg``."""
    text = str(error)
    match = _AT.search(text)
    suffix = match.group("path") if match else ""
    message = text[: match.start()] if match else text
    return f"{prefix}{suffix}: {message}"


def _decode_mapping(raw: Any, key: str, kind: Any, errors: list[str]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        errors.append(f"{key}: expected a mapping of names to entries")
        return {}
    decoded: dict[str, Any] = {}
    for name, entry in raw.items():
        try:
            decoded[str(name)] = msgspec.convert(entry, kind)
        except msgspec.ValidationError as exc:
            errors.append(_keyed(f"{key}.{name}", exc))
    return decoded


def _check_references(
    providers: dict[str, Any],
    models: dict[str, ModelConfig],
    tenants: dict[str, TenantConfig],
    errors: list[str],
) -> None:
    for alias, model in models.items():
        for index, target in enumerate(model.targets):
            where = f"models.{alias}.targets[{index}]"
            if target.provider not in providers:
                errors.append(f"{where}.provider: unknown provider '{target.provider}'")
            problem = target.price.problem() if target.price else None
            if problem:
                errors.append(f"{where}.price: {problem}")
    for name, tenant in tenants.items():
        for field in ("models", "deny_models"):
            for alias in getattr(tenant, field) or ():
                if alias not in models:
                    errors.append(f"tenants.{name}.{field}: unknown model alias '{alias}'")
        for field in ("providers", "deny_providers"):
            for provider in getattr(tenant, field) or ():
                if provider not in providers:
                    errors.append(f"tenants.{name}.{field}: unknown provider '{provider}'")


def _check_state(sections: dict[str, Any], errors: list[str]) -> None:
    ledger, state = sections.get("ledger"), sections.get("state")
    if ledger and state and ledger.backend == "redis" and state.backend != "redis":
        errors.append("ledger.backend: redis needs state.backend: redis")
    if ledger:
        _check_ledger_dsn(ledger, errors)


def _check_ledger_dsn(ledger: LedgerConfig, errors: list[str]) -> None:
    """The Postgres ledger needs exactly one of ``dsn`` and ``dsn_env``; other backends
    none (a DSN under ``auto`` or ``sqlite`` would be silently ignored)."""
    given = [name for name in ("dsn", "dsn_env") if getattr(ledger, name)]
    if ledger.backend == "postgres":
        if not given:
            errors.append(
                "ledger.dsn: backend postgres needs dsn, or dsn_env (the name of an"
                " environment variable holding the DSN, e.g. SWITCHYARD_LEDGER_DSN)"
            )
        elif len(given) == 2:
            errors.append("ledger.dsn_env: give dsn or dsn_env, not both")
    elif given:
        errors.append(f"ledger.{given[0]}: only backend postgres uses it (ledger.backend)")


def _check_webhooks(sections: dict[str, Any], tenants: dict[str, Any], errors: list[str]) -> None:
    batch = sections.get("batch")
    for name in batch.webhooks if batch else ():
        if name != "*" and name not in tenants:
            errors.append(f"batch.webhooks.{name}: unknown tenant (a tenant's name, or '*')")


def _check_observability(sections: dict[str, Any], errors: list[str]) -> None:
    observability = sections.get("observability")
    for index, pattern in enumerate(observability.redact if observability else ()):
        try:
            re.compile(pattern)
        except re.error as exc:
            errors.append(f"observability.redact[{index}]: not a regular expression: {exc}")


def parse_config(text: str | bytes) -> Config:
    """Decode and check a policy file's text; raise ``ConfigError`` listing every problem."""
    try:
        raw = msgspec.yaml.decode(text) if text else {}
    except msgspec.DecodeError as exc:
        raise ConfigError([f"(file): not valid YAML: {exc}"]) from exc
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ConfigError(["(top level): expected a mapping"])
    sections_known = set(Config.__struct_fields__) - {"source"}
    errors = [f"{key}: unknown section" for key in raw if key not in sections_known]
    providers = _decode_mapping(raw.get("providers"), "providers", ProviderConfig, errors)
    raw_models = expand_strategy_shorthand(raw.get("models"))
    models = _decode_mapping(raw_models, "models", ModelConfig, errors)
    errors = [strategy_hint(error) for error in errors]
    tenants = _decode_mapping(raw.get("tenants"), "tenants", TenantConfig, errors)
    workers = _decode_mapping(raw.get("workers"), "workers", WorkerConfig, errors)
    sections: dict[str, Any] = {"workers": workers}
    for key, kind in _SECTIONS.items():
        try:
            sections[key] = msgspec.convert(raw.get(key) or {}, kind)
        except msgspec.ValidationError as exc:
            errors.append(_keyed(key, exc))
    for key, kind in _OPTIONAL_SECTIONS.items():
        try:
            sections[key] = None if key not in raw else msgspec.convert(raw[key] or {}, kind)
        except msgspec.ValidationError as exc:
            errors.append(_keyed(key, exc))
    raw_providers = raw.get("providers")
    known = raw_providers if isinstance(raw_providers, dict) else {}
    _check_references(known, models, tenants, errors)
    errors += worker_problems(workers, {str(n): providers.get(str(n)) for n in known})
    _check_state(sections, errors)
    _check_observability(sections, errors)
    _check_webhooks(sections, tenants, errors)
    if errors:
        raise ConfigError(errors)
    return Config(providers=providers, models=models, tenants=tenants, **sections)


def load_config(path: str | Path) -> Config:
    """Read and parse the file at ``path``; a missing file is a ``ConfigError`` too."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError([f"(file): cannot read {path}: {exc.strerror}"]) from exc
    return msgspec.structs.replace(parse_config(text), source=str(Path(path).resolve()))


def relative_to_config(config: Config, path: str) -> Path:
    """``path`` as written in the file: relative paths start at the file's folder."""
    candidate = Path(path)
    if candidate.is_absolute() or config.source is None:
        return candidate
    return Path(config.source).parent / candidate
