"""What a command knows before its settings are loaded: the config file it reads,
the log format it asks for, and how it reports a failure.

Why: with ``[service].log_format = "json"`` every line a process writes must
be one JSON object, the fatal ones included; but the line that says the
configuration is wrong (a bad key, no PostgreSQL) is written when there are no
settings to read the format from. So the format is looked up on its own,
leniently, in the same places the settings come from.
"""

from __future__ import annotations

import logging
import os
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path

from core.settings import config_path
from streams.logs import LogFormat, logs_json

LOG_FORMAT_ENV = "COMPACTOR_SERVICE__LOG_FORMAT"

log = logging.getLogger("compactor")


def config_file(path: str | None, environ: Mapping[str, str] | None = None) -> Path | None:
    """The file ``load_settings(path)`` reads: ``--config``, ``$COMPACTOR_CONFIG``, or
    ./config.toml if present; absolute, so a reload finds it again. None: the defaults."""
    file = config_path(path, os.environ if environ is None else environ)
    return None if file is None else file.absolute()


def requested_log_format(path: str | None, environ: Mapping[str, str] | None = None) -> LogFormat:
    """``[service].log_format`` as the environment or the config file asks, even when
    the rest of the configuration is not valid; ``text`` when it cannot be told."""
    env = os.environ if environ is None else environ
    raw: object = env.get(LOG_FORMAT_ENV)
    if raw is not None:
        raw = str(raw).strip().strip('"')
    else:
        file = config_file(path, env)
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8")) if file else {}
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            data = {}
        service = data.get("service")
        raw = service.get("log_format") if isinstance(service, dict) else None
    return "json" if raw == "json" else "text"


def report_failure(message: str) -> None:
    """The line a command ends with when it fails: JSON like every other line when
    the process logs JSON, else ``compactor: …`` as ever."""
    if logs_json():
        log.error(message)
    else:
        print(f"compactor: {message}", file=sys.stderr)
