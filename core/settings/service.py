"""``[service]``: the worker's runtime limits and its HTTP API, with the bearer
tokens that guard it (``[[service.tokens]]``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator

from core.domain.tenancy import TENANT_ID_PATTERN
from core.settings.sections import Section

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


class TokenBinding(Section):
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


class ServiceSettings(Section):
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
    # Fewer at once while messages are stored late, so a wave of compactions does
    # not hold the turns: the limit starts here (at most the maximum above),
    # doubles each second in which more were due and no message was late, and
    # halves when a group is stored more than turn_delay_target_ms after it was
    # published (over the least delay of the last minute); 0 turns pacing off.
    min_concurrent_compactions: int = Field(default=8, ge=1)
    turn_delay_target_ms: float = Field(default=100.0, ge=0)
    # Message events accounted as one group: one PostgreSQL statement and one
    # table write per conversation per group (docs/performance.md).
    accounting_batch_max: int = Field(default=500, ge=1, le=100_000)
    # Dirty table entries reach the Faust table (its changelog) at most this
    # often; 0 writes after every group. PostgreSQL stays the source of truth.
    table_flush_seconds: float = Field(default=1.0, ge=0, le=3600)
    # After a flush of many entries the next waits longer, so the table takes at
    # most this many writes a second on average (up to 10 s between flushes);
    # 0 = every table_flush_seconds whatever it writes.
    table_writes_per_second: float = Field(default=500.0, ge=0)
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
    # How often the watchdog looks (a tick is cheap: no I/O unless it re-seeks).
    stall_check_seconds: float = Field(default=2.0, gt=0)
    # The event loop held this long is logged with the stack holding it (0: off).
    loop_stall_seconds: float = Field(default=0.25, ge=0, le=60)
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
    # Tokens over plain HTTP beyond loopback are refused at start unless
    # allow_plaintext_http = true (a network that is private, e.g. compose's).
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    tls_cafile: str | None = None
    allow_plaintext_http: bool = False
    # Forwarded requests between workers carry this credential (and the caller's
    # verified principal, signed with it) instead of the caller's token. Unset:
    # derived from the PostgreSQL DSN and app_id (see docs/security.md).
    internal_token: SecretStr | None = None
    # Remote Kafka without TLS, or remote PostgreSQL without a verified
    # certificate (sslmode verify-ca / verify-full), is refused unless this is true.
    allow_insecure_transport: bool = False
    # Requests per second per token (token bucket; 0 = no limit) and the burst:
    # enough for a platform that reads the context at every turn, 1,000 turns/s
    # and more with one token (docs/security.md, "Rate limits").
    rate_limit_per_second: float = Field(default=2000.0, ge=0)
    rate_limit_burst: int = Field(default=4000, ge=1)
    # The same for all the tokens of one tenant together (the tenant a request is
    # about: a tenant-bound token's, or tenant_id); 0 = no limit.
    tenant_rate_limit_per_second: float = Field(default=2000.0, ge=0)
    tenant_rate_limit_burst: int = Field(default=4000, ge=1)
    # What a memory search takes from those buckets (any other request takes 1).
    rate_limit_search_cost: float = Field(default=20.0, ge=1, le=1_000_000)
    # Memory searches being answered at once per tenant (per token for a search
    # of no tenant); one more is 429. 0 = no cap.
    max_concurrent_searches_per_tenant: int = Field(default=4, ge=0)
    # Failed authentications per client address: refill rate and burst (0 = no limit).
    auth_failures_per_second: float = Field(default=0.5, ge=0)
    auth_failures_burst: int = Field(default=20, ge=1)
    # History and batch views: messages per page by default, and at most.
    page_default_limit: int = Field(default=200, ge=1, le=100_000)
    page_max_limit: int = Field(default=1000, ge=1, le=100_000)
    # The context view (GET /conversations/{id}/context): how long a read may wait for
    # the message it names (through=, after=), and the bytes of rendered contexts kept
    # for readers that find the history unchanged.
    context_max_wait_ms: int = Field(default=5000, ge=0, le=60_000)
    context_cache_bytes: int = Field(default=64 * 1024 * 1024, ge=0)

    @field_validator("api_tokens", "metrics_token", "internal_token")
    @classmethod
    def _token_length(cls, value: Any) -> Any:
        for token in value if isinstance(value, tuple) else (value,):
            if token is not None:
                check_token(token)
        return value
