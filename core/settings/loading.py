"""Loading the configuration: which file, the environment over it, and what a
problem says.

An invalid value stops start-up with one line per problem naming the key, the
value (never a secret's) and what is allowed, and the variable when the value
came from the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from core.settings.errors import ConfigError
from core.settings.root import Settings
from core.settings.sources import EnvironmentSource, Overrides, env_overrides, read_toml

#: The config file when no path is given (else ./config.toml if present).
CONFIG_ENV = "COMPACTOR_CONFIG"

_SECRET_WORDS = ("token", "password", "secret", "dsn", "key")


def _describe(error: Mapping[str, Any], overrides: Overrides | None = None) -> str:
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


def _is_section(name: str) -> bool:
    model = Settings.model_fields[name].annotation
    return isinstance(model, type) and issubclass(model, BaseModel)


def _layered(data: Mapping[str, Any], environment: Mapping[str, Any]) -> dict[str, Any]:
    """The environment's keys over the file's, key by key: a variable replaces its
    key's whole value (a table such as ``[usage].prices`` too, never merged)."""
    merged = dict(data)
    for name, value in environment.items():
        table = merged.get(name)
        if not _is_section(name):  # [[tenants]]: the variable holds the whole list
            merged[name] = value
        # A section that is not a table in the file is reported by validation as is.
        elif table is None or isinstance(table, Mapping):
            merged[name] = {**(table or {}), **value}
    return merged


def parse_settings(
    data: Mapping[str, Any],
    source: str = "config",
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Validate ``data`` (a parsed config file) with the ``COMPACTOR_<SECTION>__<KEY>``
    variables of ``environ`` layered over it (the environment wins). ``environ=None``:
    the file alone. A problem names the key, and the variable when it came from one."""
    overrides: Overrides = {}
    layered = dict(data)
    if environ is not None:
        overrides = env_overrides(environ)  # an unknown variable stops here, named
        layered = _layered(data, EnvironmentSource(environ)())
    try:
        return Settings.model_validate(layered)
    except ValidationError as error:
        problems = "\n  ".join(_describe(e, overrides) for e in error.errors())
        if overrides:
            source = f"{source} and the environment"
        raise ConfigError(f"invalid configuration in {source}:\n  {problems}") from None


def config_path(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> Path | None:
    """The file ``load_settings`` reads: ``path``, or ``$COMPACTOR_CONFIG``, or
    ./config.toml if present; None: none (the defaults). A reload (SIGHUP) reads
    this same file again."""
    env = os.environ if environ is None else environ
    candidate = path or env.get(CONFIG_ENV)
    if candidate is None:
        candidate = "config.toml" if Path("config.toml").exists() else None
    return None if candidate is None else Path(candidate)


def load_settings(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Load ``config_path(path)``, or the defaults, with the ``COMPACTOR_<SECTION>__<KEY>``
    variables of ``environ`` (default: the process's) over it."""
    env = os.environ if environ is None else environ
    file = config_path(path, env)
    if file is None:
        return parse_settings({}, source="the defaults", environ=env)
    return parse_settings(read_toml(file), source=str(file), environ=env)
