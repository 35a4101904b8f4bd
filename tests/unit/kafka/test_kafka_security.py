"""``[kafka]`` security settings → the one set of client arguments every Kafka client gets.

Why: the worker (Faust), replay, tail, topics and the probe must all connect
the same way; a client left on PLAINTEXT, or a password in a log line, is the
failure this pins. The broker-facing half is tests/integration/test_kafka_secure.py.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import certifi
import pytest

from core.settings import ConfigError, KafkaSettings, parse_settings
from streams.kafka import probe as kafka_probe
from streams.kafka.security import PLAINTEXT, KafkaSecurity, kafka_security

pytestmark = pytest.mark.unit

CA = certifi.where()
ENV = {"KAFKA_SASL_USERNAME": "app", "KAFKA_SASL_PASSWORD": "s3cret-pw"}


def kafka(**values: object) -> KafkaSettings:
    return parse_settings({"kafka": values}).kafka


def test_plaintext_is_the_default_and_adds_nothing() -> None:
    security = kafka_security(KafkaSettings(), {})
    assert security == PLAINTEXT
    assert security.client_kwargs() == {"security_protocol": "PLAINTEXT"}
    assert security.faust_credentials() is None


def test_sasl_ssl_gives_context_mechanism_and_credentials_from_the_environment() -> None:
    security = kafka_security(
        kafka(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256", ssl_cafile=CA), ENV
    )
    kwargs = security.client_kwargs()
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-256"
    assert (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == ("app", "s3cret-pw")
    context = kwargs["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_the_faust_app_gets_exactly_the_cli_clients_arguments() -> None:
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from streams.kafka.faust_app import create_app

    for protocol in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        tls = {"ssl_cafile": CA} if "SSL" in protocol else {}
        settings = parse_settings({"kafka": {"security_protocol": protocol, **tls}})
        with pytest.MonkeyPatch.context() as patch:
            for name, value in ENV.items():
                patch.setenv(name, value)
            app = create_app(settings, "127.0.0.1:9092")
            expected = kafka_security(settings.kafka).client_kwargs()
        faust_kwargs = dict(credentials_to_aiokafka_auth(app.conf.broker_credentials))
        if faust_kwargs.get("ssl_context") is None:
            faust_kwargs.pop("ssl_context", None)
        assert {k: v for k, v in faust_kwargs.items() if k != "ssl_context"} == {
            k: v for k, v in expected.items() if k != "ssl_context"
        }, protocol
        assert ("ssl_context" in faust_kwargs) == ("ssl_context" in expected), protocol


def test_file_username_and_password_work_but_the_environment_wins() -> None:
    settings = kafka(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="file-user",
        sasl_password="file-pw",
    )
    from_file = kafka_security(settings, {})
    assert (from_file.username, from_file.secret()) == ("file-user", "file-pw")
    assert "ssl_context" not in from_file.client_kwargs()
    from_env = kafka_security(settings, ENV)
    assert (from_env.username, from_env.secret()) == ("app", "s3cret-pw")
    named = kafka(security_protocol="SASL_PLAINTEXT", sasl_password_env="MY_PW")
    assert kafka_security(named, {"KAFKA_SASL_USERNAME": "u", "MY_PW": "x"}).secret() == "x"


def test_the_password_is_in_no_repr() -> None:
    settings = parse_settings(
        {"kafka": {"security_protocol": "SASL_SSL", "sasl_password": "file-secret-pw"}}
    )
    assert "file-secret-pw" not in repr(settings) and "file-secret-pw" not in str(settings)
    security = kafka_security(settings.kafka, ENV)
    credentials = security.faust_credentials()
    for text in (repr(security), str(security), security.describe(), repr(credentials)):
        assert "s3cret-pw" not in text and "file-secret-pw" not in text
    assert security.describe() == "SASL_SSL (SCRAM-SHA-512 as 'app')"


@pytest.mark.parametrize(
    ("values", "env", "message"),
    [
        ({"security_protocol": "SASL_SSL"}, {}, r"\$KAFKA_SASL_USERNAME"),
        (
            {"security_protocol": "SASL_SSL"},
            {"KAFKA_SASL_USERNAME": "u"},
            r"\$KAFKA_SASL_PASSWORD",
        ),
        ({"ssl_cafile": CA}, {}, r"\[kafka\]\.ssl_cafile is set but .*PLAINTEXT"),
        ({"sasl_username": "u"}, {}, r"uses no SASL"),
        ({"security_protocol": "SSL", "ssl_cafile": "/nope/ca.pem"}, {}, "no such file"),
        ({"security_protocol": "SSL", "ssl_keyfile": CA}, {}, "needs .*ssl_certfile"),
        ({"security_protocol": "SSL", "ssl_cafile": __file__}, {}, "not a PEM CA file"),
    ],
)
def test_misconfigurations_name_the_key(
    values: dict[str, object], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        kafka_security(kafka(**values), env)


def test_unknown_protocol_or_mechanism_is_refused() -> None:
    with pytest.raises(ConfigError, match="security_protocol"):
        kafka(security_protocol="TLS")
    with pytest.raises(ConfigError, match="sasl_mechanism"):
        kafka(sasl_mechanism="GSSAPI")


def test_check_hostname_can_be_turned_off_but_verification_stays(tmp_path: Path) -> None:
    security = kafka_security(
        kafka(security_protocol="SSL", ssl_cafile=CA, ssl_check_hostname=False), {}
    )
    assert security.ssl_context is not None
    assert not security.ssl_context.check_hostname
    assert security.ssl_context.verify_mode == ssl.CERT_REQUIRED


def test_the_probes_scram_login_matches_rfc_7677(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SCRAM-SHA-256 exchange of RFC 7677 section 3, byte for byte."""
    client_nonce = "rOprNGfwEbeRWgbNEkqO"
    server_nonce = client_nonce + "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    sent: list[bytes] = []
    replies = [
        f"r={server_nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".encode(),
        b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
    ]

    def authenticate(sock: object, token: bytes, correlation: int) -> bytes:
        sent.append(token)
        return replies.pop(0)

    monkeypatch.setattr(kafka_probe, "_sasl_authenticate", authenticate)
    monkeypatch.setattr(kafka_probe.secrets, "token_urlsafe", lambda n: client_nonce)
    kafka_probe._scram_login(None, "SCRAM-SHA-256", "user", "pencil")  # type: ignore[arg-type]
    assert sent == [
        f"n,,n=user,r={client_nonce}".encode(),
        f"c=biws,r={server_nonce},p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=".encode(),
    ]


def test_the_probe_rejects_a_forged_server_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    replies = [b"r=abcdef,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096", b"v=AAAA"]
    monkeypatch.setattr(kafka_probe, "_sasl_authenticate", lambda *a: replies.pop(0))
    monkeypatch.setattr(kafka_probe.secrets, "token_urlsafe", lambda n: "abc")
    with pytest.raises(kafka_probe.BrokerAuthenticationError, match="signature"):
        kafka_probe._scram_login(None, "SCRAM-SHA-512", "u", "p")  # type: ignore[arg-type]


def test_security_is_immutable() -> None:
    with pytest.raises(AttributeError):
        KafkaSecurity().protocol = "SSL"  # type: ignore[misc]
