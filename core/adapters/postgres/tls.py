"""``[postgres].sslmode`` / ``ssl_rootcert`` → the DSN every asyncpg connection uses.

The settings are written into the DSN's query string (``sslmode``,
``sslrootcert``), which asyncpg reads like libpq does, so the store's pool, the
migrations and the dev-stack probe all connect the same way without each
taking extra arguments. A parameter the DSN already has wins: the DSN is the
more specific statement (one server), the settings the default for all.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from core.settings import ConfigError, PostgresSettings


def dsn_with_tls(dsn: str, settings: PostgresSettings) -> str:
    """``dsn`` with ``sslmode`` / ``sslrootcert`` from ``settings`` where it has none."""
    wanted = {"sslmode": settings.sslmode, "sslrootcert": settings.ssl_rootcert}
    if not any(wanted.values()):
        return dsn
    if settings.ssl_rootcert and not Path(settings.ssl_rootcert).expanduser().is_file():
        raise ConfigError(f"[postgres].ssl_rootcert = {settings.ssl_rootcert!r}: no such file")
    parts = urlsplit(dsn)
    query = parse_qsl(parts.query, keep_blank_values=True)
    present = {key for key, _ in query}
    for key, value in wanted.items():
        if value and key not in present:
            if key == "sslrootcert":
                value = str(Path(value).expanduser())
            query.append((key, value))
    return urlunsplit(parts._replace(query=urlencode(query)))
