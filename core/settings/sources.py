"""Where the settings' values come from: the TOML file and the environment.

pydantic-settings reads both: ``TomlConfigSettingsSource`` the file,
``EnvSettingsSource`` the ``COMPACTOR_<SECTION>__<KEY>`` variables (the prefix and
delimiter of ``Settings.model_config``; it folds their case, nests them and
decodes lists and tables from JSON). Kept here: the check that every such
variable names a key the settings have (the source ignores the others, and a
misspelt variable silently ignored would leave a default nobody chose).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import EnvSettingsSource, TomlConfigSettingsSource

from core.settings.errors import ConfigError
from core.settings.root import ENV_NESTED_DELIMITER, ENV_PREFIX, Settings

#: ``[[tenants]]`` from the environment: the whole list, as JSON.
TENANTS_ENV = "COMPACTOR_TENANTS"

#: ``(section, key) → (variable, its text)``; the key of ``[[tenants]]`` is "".
Overrides = dict[tuple[str, str], tuple[str, str]]


def env_name(section: str, key: str) -> str:
    """The environment variable of ``[section].key``."""
    return f"{ENV_PREFIX}{section.upper()}{ENV_NESTED_DELIMITER}{key.upper()}"


def is_settings_variable(variable: str) -> bool:
    """``COMPACTOR_<SECTION>__<KEY>`` or ``COMPACTOR_TENANTS``; ``COMPACTOR_CONFIG`` and
    ``COMPACTOR_API_TOKENS`` have no ``__``: not settings keys."""
    return variable == TENANTS_ENV or (
        variable.startswith(ENV_PREFIX) and ENV_NESTED_DELIMITER in variable
    )


def env_overrides(environ: Mapping[str, str]) -> Overrides:
    """Every settings variable of ``environ`` and the key it sets; a section or key the
    settings do not have is a ConfigError naming the variable."""
    found: Overrides = {}
    for variable in sorted(filter(is_settings_variable, environ)):
        if variable == TENANTS_ENV:  # [[tenants]], a list of tables: JSON
            found[("tenants", "")] = (variable, environ[variable])
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
        found[(section, key)] = (variable, environ[variable])
    return found


class EnvironmentSource(EnvSettingsSource):
    """The settings variables of one environment mapping (a test's, or the process's),
    where pydantic-settings would read ``os.environ``. Only exact ``COMPACTOR_`` names
    with ``__`` count, so ``COMPACTOR_SERVICE='{…}'`` sets nothing, as the docs say."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        names = sorted(filter(is_settings_variable, environ))
        self._environ = {name: environ[name] for name in names}
        super().__init__(Settings, case_sensitive=False)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {name.lower(): value for name, value in self._environ.items()}

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        """A list or table that is not JSON stays the text: validation then names the
        variable, the key and what is expected, as for any other bad value."""
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError:
            return value


def read_toml(file: Path) -> dict[str, Any]:
    """The tables of ``file``; a missing file or bad TOML is a ConfigError."""
    if not file.is_file():
        raise ConfigError(f"config file not found: {file}")
    try:
        # absolute(): the source would expand a leading ~, which the path given never meant.
        return TomlConfigSettingsSource(Settings, toml_file=file.absolute())()
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{file} is not valid TOML: {error}") from None
