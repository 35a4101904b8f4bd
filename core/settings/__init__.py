"""``config.toml``: loading, validation and secrets.

Every field has the seeds' default, so an empty file (or none) is a valid
configuration. An invalid value stops start-up with a message naming the key,
the value and what is allowed (and the variable, when the environment set it).
API keys are read from the environment variable a section names, never from
the file.

``sections`` and ``service``: the tables; ``root``: ``Settings``, all of them;
``sources``: the file and the environment (pydantic-settings); ``loading``:
``load_settings`` / ``parse_settings``; ``model_choice``: ``resolve_model``.
"""

from core.settings.errors import ConfigError
from core.settings.loading import (
    CONFIG_ENV,
    config_path,
    load_settings,
    parse_settings,
)
from core.settings.model_choice import (
    DEFAULT_KEY_ENV,
    DEFAULT_MODELS,
    ResolvedKind,
    ResolvedModel,
    resolve_model,
)
from core.settings.root import ENV_NESTED_DELIMITER, ENV_PREFIX, Settings
from core.settings.sections import (
    MIN_SIGNING_KEY_CHARS,
    ArchiveSettings,
    EmbeddingSettings,
    KafkaSettings,
    PostgresSettings,
    ProviderKind,
    SummarizationSettings,
    TenancySettings,
    TenantSettings,
    UsageSettings,
    default_min_insync,
)
from core.settings.service import (
    MIN_TOKEN_CHARS,
    TENANT_PATTERN,
    TOKEN_HASH_PREFIX,
    Scope,
    ServiceSettings,
    TokenBinding,
    check_token,
)
from core.settings.sources import TENANTS_ENV, env_name, env_overrides

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_KEY_ENV",
    "DEFAULT_MODELS",
    "ENV_NESTED_DELIMITER",
    "ENV_PREFIX",
    "MIN_SIGNING_KEY_CHARS",
    "MIN_TOKEN_CHARS",
    "TENANTS_ENV",
    "TENANT_PATTERN",
    "TOKEN_HASH_PREFIX",
    "ArchiveSettings",
    "ConfigError",
    "EmbeddingSettings",
    "KafkaSettings",
    "PostgresSettings",
    "ProviderKind",
    "ResolvedKind",
    "ResolvedModel",
    "Scope",
    "ServiceSettings",
    "Settings",
    "SummarizationSettings",
    "TenancySettings",
    "TenantSettings",
    "TokenBinding",
    "UsageSettings",
    "check_token",
    "config_path",
    "default_min_insync",
    "env_name",
    "env_overrides",
    "load_settings",
    "parse_settings",
    "resolve_model",
]
