"""Secrets stay out of ``repr`` and logs; unprotected remote transport is refused."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from core.settings import ConfigError, Settings, parse_settings
from streams.bootstrap import build_app
from streams.database import configured_dsn
from streams.transport import check_transport, dsn_hosts, is_local

pytestmark = pytest.mark.unit

PASSWORD = "hunter2-very-secret"
DSN = f"postgresql://compactor:{PASSWORD}@db.internal:5432/compactor"


def test_the_dsn_is_a_secret_and_every_reader_gets_its_value(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("POSTGRES_DSN", raising=False)
    config = parse_settings(
        {
            "postgres": {"dsn": DSN, "sslmode": "verify-full"},
            "kafka": {"sasl_password": PASSWORD + "-kafka"},
            "service": {"internal_token": PASSWORD + "-internal"},
        }
    )
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("compactor.test").info("settings: %s / %r", config, config)
    for text in (repr(config), str(config), repr(config.postgres), caplog.text):
        assert PASSWORD not in text
        assert "db.internal" not in text  # the whole DSN is hidden, not just the password
    assert config.postgres.dsn is not None
    assert config.postgres.dsn.get_secret_value() == DSN
    assert configured_dsn(config) == DSN + "?sslmode=verify-full"
    with pytest.raises(ConfigError) as error:
        parse_settings({"postgres": {"dsn": f"mysql://app:{PASSWORD}@db/x"}})
    assert PASSWORD not in str(error.value) and "[postgres].dsn" in str(error.value)
    assert parse_settings({"postgres": {"dsn": ""}}).postgres.dsn is None


def _settings(**sections: Any) -> Settings:
    return parse_settings(sections)


@pytest.mark.parametrize(
    "servers",
    ["kafka-1.internal:9092", "127.0.0.1:9092,10.0.0.7:9092", "[2001:db8::1]:9092"],
)
@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SASL_PLAINTEXT"])
def test_remote_kafka_without_tls_is_refused_naming_the_key(servers: str, protocol: str) -> None:
    config = _settings(kafka={"security_protocol": protocol})
    with pytest.raises(ConfigError) as error:
        check_transport(config, bootstrap=servers, dsn=None, environ={})
    assert "[kafka].security_protocol" in str(error.value)
    assert "[service].allow_insecure_transport" in str(error.value)
    allowed = _settings(
        kafka={"security_protocol": protocol}, service={"allow_insecure_transport": True}
    )
    check_transport(allowed, bootstrap=servers, dsn=None, environ={})
    for tls in ("SSL", "SASL_SSL"):
        check_transport(
            _settings(kafka={"security_protocol": tls}), bootstrap=servers, dsn=None, environ={}
        )


def test_loopback_kafka_and_postgres_need_nothing() -> None:
    for servers in ("127.0.0.1:9092", "localhost:9092,127.0.0.2:9093", "[::1]:9092"):
        check_transport(Settings(), bootstrap=servers, dsn=None, environ={})
    for dsn in (
        "postgresql://u:p@127.0.0.1:5432/db",
        "postgresql://u:p@localhost/db",
        "postgresql://u:p@[::1]:5432/db",
        "postgresql:///db?host=/var/run/postgresql",
        "postgresql://u@/db",
    ):
        check_transport(Settings(), bootstrap="127.0.0.1:9092", dsn=dsn, environ={})


@pytest.mark.parametrize(
    "dsn",
    [
        DSN,
        DSN + "?sslmode=require",
        "postgresql://u:p@127.0.0.1:5432,db.internal:5432/x?sslmode=prefer",
        "postgresql://u:p@/x?host=db.internal",
    ],
)
def test_remote_postgres_without_verification_is_refused_naming_the_key(dsn: str) -> None:
    with pytest.raises(ConfigError) as error:
        check_transport(Settings(), bootstrap=None, dsn=dsn, environ={})
    message = str(error.value)
    assert "[postgres].sslmode" in message and "[service].allow_insecure_transport" in message
    assert PASSWORD not in message and ":p@" not in message
    allowed = _settings(service={"allow_insecure_transport": True})
    check_transport(allowed, bootstrap=None, dsn=dsn, environ={})


def test_verified_remote_postgres_is_fine() -> None:
    for mode in ("verify-ca", "verify-full"):
        check_transport(Settings(), bootstrap=None, dsn=f"{DSN}?sslmode={mode}", environ={})
    check_transport(Settings(), bootstrap=None, dsn=DSN, environ={"PGSSLMODE": "verify-full"})


def test_the_worker_refuses_to_start_before_connecting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POSTGRES_DSN", raising=False)
    # Nothing listens there: the refusal comes before any connection is tried.
    with pytest.raises(ConfigError, match=r"\[kafka\]\.security_protocol"):
        build_app(Settings(), bootstrap="kafka.example.invalid:9092")
    config = _settings(postgres={"dsn": DSN})
    with pytest.raises(ConfigError, match=r"\[postgres\]\.sslmode"):
        build_app(config, bootstrap="127.0.0.1:1")


def test_host_helpers() -> None:
    assert is_local("127.8.9.10") and is_local("::1") and is_local("") and is_local("/tmp/s")
    assert not is_local("10.0.0.1") and not is_local("db") and not is_local("0.0.0.0")
    assert dsn_hosts("postgresql://u:p@a:1,b:2/db") == ["a", "b"]
