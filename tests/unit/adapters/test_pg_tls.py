"""``[postgres].sslmode`` / ``ssl_rootcert`` are merged into the DSN; the DSN's own parameters win.

The server-facing half (verify-full, wrong host name, wrong CA) is
tests/integration/test_postgres_tls.py.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import certifi
import pytest

from core.adapters.postgres.tls import dsn_with_tls
from core.settings import ConfigError, PostgresSettings

pytestmark = pytest.mark.unit

CA = certifi.where()


def params(dsn: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(dsn).query)


def test_nothing_set_leaves_the_dsn_alone() -> None:
    dsn = "postgresql://u:p@db:5432/app?application_name=x"
    assert dsn_with_tls(dsn, PostgresSettings()) == dsn


def test_settings_are_added_to_the_query() -> None:
    settings = PostgresSettings(sslmode="verify-full", ssl_rootcert=CA)
    merged = dsn_with_tls("postgresql://u:p@db:5432/app?application_name=x", settings)
    assert params(merged) == {
        "application_name": ["x"],
        "sslmode": ["verify-full"],
        "sslrootcert": [CA],
    }
    assert merged.startswith("postgresql://u:p@db:5432/app?")


def test_the_dsns_own_parameters_win() -> None:
    settings = PostgresSettings(sslmode="verify-full", ssl_rootcert=CA)
    merged = dsn_with_tls("postgresql://db/app?sslmode=require", settings)
    assert params(merged) == {"sslmode": ["require"], "sslrootcert": [CA]}


def test_a_missing_root_certificate_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"\[postgres\]\.ssl_rootcert = '/nope/ca.pem'"):
        dsn_with_tls("postgresql://db/app", PostgresSettings(ssl_rootcert="/nope/ca.pem"))


def test_an_unknown_sslmode_is_refused() -> None:
    from core.settings import parse_settings

    with pytest.raises(ConfigError, match="sslmode"):
        parse_settings({"postgres": {"sslmode": "allow-anything"}})
