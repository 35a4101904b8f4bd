"""Kafka transport security: ``[kafka]`` settings → the arguments of every Kafka client.

One function (:func:`kafka_security`) reads the settings and the environment
once; the worker's Faust app (``faust_credentials``), the CLI's aiokafka
clients (``client_kwargs``: replay, tail, topics) and the broker probe
(``streams.kafka.probe``) all take what it returns, so a client can never be
configured differently from the others.

Credentials: ``$KAFKA_SASL_USERNAME`` wins over ``[kafka].sasl_username``; the
password comes from the variable ``[kafka].sasl_password_env`` names
(``KAFKA_SASL_PASSWORD``) or, only if written there explicitly, from
``[kafka].sasl_password``. It is kept as a ``SecretStr`` and never appears in a
``repr``, a log line or an error message.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from core.settings import ConfigError, KafkaSettings

if TYPE_CHECKING:
    from faust.types.auth import CredentialsT

KAFKA_SASL_USERNAME_ENV = "KAFKA_SASL_USERNAME"

TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
SASL_PROTOCOLS = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})


@dataclass(frozen=True)
class KafkaSecurity:
    """How to talk to the broker: protocol, TLS context, SASL mechanism and credentials."""

    protocol: str = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = None
    sasl_mechanism: str | None = None
    username: str | None = None
    password: SecretStr | None = field(default=None, repr=False)

    @property
    def uses_tls(self) -> bool:
        return self.protocol in TLS_PROTOCOLS

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in SASL_PROTOCOLS

    def describe(self) -> str:
        """For messages: ``SASL_SSL (SCRAM-SHA-512 as 'app')`` (never the password)."""
        if self.uses_sasl:
            return f"{self.protocol} ({self.sasl_mechanism} as {self.username!r})"
        return self.protocol

    def secret(self) -> str:
        return self.password.get_secret_value() if self.password is not None else ""

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``AIOKafkaProducer``/``Consumer``/``AdminClient``."""
        kwargs: dict[str, Any] = {"security_protocol": self.protocol}
        if self.ssl_context is not None:
            kwargs["ssl_context"] = self.ssl_context
        if self.uses_sasl:
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.username
            kwargs["sasl_plain_password"] = self.secret()
        return kwargs

    def faust_credentials(self) -> CredentialsT | None:
        """``faust.App(broker_credentials=...)``: Faust hands them to each of its clients."""
        from faust.auth import SASLCredentials, SSLCredentials

        if self.uses_sasl:
            return SASLCredentials(
                username=self.username,
                password=self.secret(),
                ssl_context=self.ssl_context,  # set exactly for SASL_SSL
                mechanism=self.sasl_mechanism,
            )
        if self.ssl_context is not None:
            return SSLCredentials(self.ssl_context)
        return None


PLAINTEXT = KafkaSecurity()


def _existing(key: str, value: str) -> str:
    path = Path(value).expanduser()
    if not path.is_file():
        raise ConfigError(f"[kafka].{key} = {value!r}: no such file")
    return str(path)


def ssl_context_for(settings: KafkaSettings) -> ssl.SSLContext:
    """Verifying context: ``ssl_cafile`` (else the system's CAs), optional client certificate."""
    cafile = _existing("ssl_cafile", settings.ssl_cafile) if settings.ssl_cafile else None
    if settings.ssl_keyfile and not settings.ssl_certfile:
        raise ConfigError("[kafka].ssl_keyfile needs [kafka].ssl_certfile (the client certificate)")
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    except ssl.SSLError as error:
        raise ConfigError(f"[kafka].ssl_cafile = {cafile!r}: not a PEM CA file: {error}") from None
    context.check_hostname = settings.ssl_check_hostname
    if settings.ssl_certfile:
        certfile = _existing("ssl_certfile", settings.ssl_certfile)
        keyfile = _existing("ssl_keyfile", settings.ssl_keyfile) if settings.ssl_keyfile else None
        try:
            context.load_cert_chain(certfile, keyfile)
        except ssl.SSLError as error:
            raise ConfigError(
                f"[kafka].ssl_certfile = {certfile!r}: cannot load the client certificate "
                f"and key: {error}"
            ) from None
    return context


def kafka_security(
    settings: KafkaSettings, environ: Mapping[str, str] | None = None
) -> KafkaSecurity:
    """The one place ``[kafka]`` security settings become client configuration.

    Raises ``ConfigError`` naming the key for a missing file, missing
    credentials, or TLS/SASL settings that the chosen protocol would ignore.
    """
    env = os.environ if environ is None else environ
    protocol = settings.security_protocol
    tls_keys = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")
    if protocol not in TLS_PROTOCOLS:
        stray = [key for key in tls_keys if getattr(settings, key)]
        if stray:
            raise ConfigError(
                f"[kafka].{stray[0]} is set but security_protocol = {protocol!r} uses no TLS "
                "(SSL or SASL_SSL does)"
            )
    if protocol not in SASL_PROTOCOLS:
        if settings.sasl_username or settings.sasl_password:
            raise ConfigError(
                f"[kafka].sasl_username/sasl_password are set but security_protocol = "
                f"{protocol!r} uses no SASL (SASL_PLAINTEXT or SASL_SSL does)"
            )
        context = ssl_context_for(settings) if protocol in TLS_PROTOCOLS else None
        return KafkaSecurity(protocol, context)
    username = env.get(KAFKA_SASL_USERNAME_ENV) or settings.sasl_username
    if not username:
        raise ConfigError(
            f"[kafka].security_protocol = {protocol!r} needs a SASL username: set "
            f"${KAFKA_SASL_USERNAME_ENV} or [kafka].sasl_username"
        )
    from_env = env.get(settings.sasl_password_env)
    password = SecretStr(from_env) if from_env else settings.sasl_password
    if password is None or not password.get_secret_value():
        raise ConfigError(
            f"[kafka].security_protocol = {protocol!r} needs a SASL password: set "
            f"${settings.sasl_password_env} (the variable [kafka].sasl_password_env names)"
        )
    context = ssl_context_for(settings) if protocol in TLS_PROTOCOLS else None
    return KafkaSecurity(protocol, context, settings.sasl_mechanism, username, password)
