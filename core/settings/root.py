"""``Settings``: the whole configuration, one field per table of config.toml.

A pydantic-settings model: its config says how a key is named in the
environment (``COMPACTOR_<SECTION>__<KEY>``) for the sources in
``core.settings.sources``.
"""

from __future__ import annotations

from pydantic import field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from core.domain.budget import BudgetConfig
from core.domain.keep_rules import KeepVerbatim
from core.settings.sections import (
    ArchiveSettings,
    CompactionSettings,
    EmbeddingSettings,
    KafkaSettings,
    PostgresSettings,
    SummarizationSettings,
    TenancySettings,
    TenantSettings,
    UsageSettings,
)
from core.settings.service import ServiceSettings

#: ``COMPACTOR_<SECTION>__<KEY>`` sets ``[section].key``: ``COMPACTOR_BUDGET__CONTEXT_BUDGET``.
ENV_PREFIX = "COMPACTOR_"
ENV_NESTED_DELIMITER = "__"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        validate_default=False,
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        # The file's tables as written: [Summarization] is an unknown key, as in
        # every section. (The environment source folds the variables' case itself.)
        case_sensitive=True,
    )

    summarization: SummarizationSettings = SummarizationSettings()
    compaction: CompactionSettings = CompactionSettings()
    budget: BudgetConfig = BudgetConfig()
    postgres: PostgresSettings = PostgresSettings()
    embedding: EmbeddingSettings = EmbeddingSettings()
    archive: ArchiveSettings = ArchiveSettings()
    kafka: KafkaSettings = KafkaSettings()
    service: ServiceSettings = ServiceSettings()
    tenancy: TenancySettings = TenancySettings()
    usage: UsageSettings = UsageSettings()
    tenants: tuple[TenantSettings, ...] = ()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """``Settings(...)`` is its arguments over the defaults, never the process's
        environment: ``load_settings`` layers a file and the environment it is given
        (a test's, ``config check``'s) explicitly."""
        return (init_settings,)

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

    def keep_verbatim(self) -> dict[str, KeepVerbatim]:
        """Tenant id → its must-survive rules, for the tenants that set some."""
        return {t.id: t.keep_verbatim for t in self.tenants if t.keep_verbatim is not None}

    def tenant_weights(self) -> dict[str, float]:
        """Tenant → fair-share weight, for the tenants whose entry sets one."""
        return {t.id: t.weight for t in self.tenants if t.weight != 1.0}
