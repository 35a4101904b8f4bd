"""``--secure``: a local broker with TLS and SASL listeners, for the client's security paths.

A generated CA signs the broker's certificate and a client certificate; the
broker listens with SASL_SSL (PLAIN, SCRAM-SHA-256 and -512) and with SSL
requiring a client certificate, so every ``[kafka]`` security setting the
service offers can be tested against a real broker (docs/security.md).
"""

from __future__ import annotations

import json
import secrets
import ssl
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from devtools.tls import CertificateAuthority, Issued, issue, make_ca
from streams.kafka.probe import LOOPBACK
from streams.kafka.security import KafkaSecurity

SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
INTER_BROKER_MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class SecureBroker:
    """What makes a local broker a secure one: a generated CA, the broker's certificate
    (``localhost`` and ``127.0.0.1``), a client certificate, and SCRAM users.

    The broker then listens with SASL_SSL (PLAIN, SCRAM-SHA-256 and -512; the
    client ``username`` has SCRAM credentials for both and a PLAIN password,
    the same one) and with SSL requiring a client certificate signed by the
    CA; brokers talk to each other over SASL_SSL as ``admin``. Everything
    lives in ``directory`` (``users.json`` holds the passwords, mode 0600) and
    is reused when it exists, since the formatted storage keeps the users.
    """

    directory: Path
    ca: CertificateAuthority
    server: Issued
    client: Issued
    username: str
    password: str
    admin_password: str

    @classmethod
    def create(cls, directory: Path, username: str = "compactor") -> SecureBroker:
        directory = directory.resolve()
        users = directory / "users.json"
        if users.exists():
            saved = json.loads(users.read_text())
            ca = CertificateAuthority(directory / "ca.pem", directory / "ca.key")
            server, client = (
                Issued(
                    directory / f"{n}.pem", directory / f"{n}.key", directory / f"{n}-bundle.pem"
                )
                for n in ("broker", "client")
            )
            return cls(directory, ca, server, client, **saved)
        ca = make_ca(directory, "ca")
        server = issue(ca, directory, "broker")
        client = issue(ca, directory, "client", dns=(), ips=())
        made = cls(
            directory, ca, server, client, username, secrets.token_hex(16), secrets.token_hex(16)
        )
        users.touch(mode=0o600)
        users.write_text(
            json.dumps(
                {
                    "username": username,
                    "password": made.password,
                    "admin_password": made.admin_password,
                }
            )
        )
        return made

    def context(self, *, client_certificate: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca.cert))
        if client_certificate:
            context.load_cert_chain(str(self.client.cert), str(self.client.key))
        return context

    def client_security(
        self, mechanism: str = "SCRAM-SHA-512", *, password: str | None = None
    ) -> KafkaSecurity:
        """How a client of the SASL_SSL listener connects (``password`` overrides, for tests)."""
        return KafkaSecurity(
            "SASL_SSL",
            self.context(),
            mechanism,
            self.username,
            SecretStr(password if password is not None else self.password),
        )

    def admin_security(self) -> KafkaSecurity:
        return KafkaSecurity(
            "SASL_SSL",
            self.context(),
            INTER_BROKER_MECHANISM,
            "admin",
            SecretStr(self.admin_password),
        )

    def format_args(self) -> list[str]:
        """``kafka-storage format --add-scram``: KRaft keeps SCRAM users in its metadata."""
        args = [f"--add-scram={INTER_BROKER_MECHANISM}=[name=admin,password={self.admin_password}]"]
        for mechanism in SCRAM_MECHANISMS:
            args.append(f"--add-scram={mechanism}=[name={self.username},password={self.password}]")
        return args

    def server_properties(self, port: int, ssl_port: int, controller_port: int) -> dict[str, str]:
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required"
        admin = f'username="admin" password="{self.admin_password}";'
        plain = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="admin" password="{self.admin_password}" '
            f'user_admin="{self.admin_password}" user_{self.username}="{self.password}";'
        )
        return {
            "listeners": (
                f"SASL_SSL://{LOOPBACK}:{port},SSL://{LOOPBACK}:{ssl_port},"
                f"CONTROLLER://{LOOPBACK}:{controller_port}"
            ),
            "advertised.listeners": f"SASL_SSL://{LOOPBACK}:{port},SSL://{LOOPBACK}:{ssl_port}",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,SSL:SSL,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "SASL_SSL",
            "sasl.enabled.mechanisms": "PLAIN," + ",".join(SCRAM_MECHANISMS),
            "sasl.mechanism.inter.broker.protocol": INTER_BROKER_MECHANISM,
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": f"{scram} {admin}",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": f"{scram} {admin}",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": plain,
            "listener.name.ssl.ssl.client.auth": "required",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.server.bundle),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca.cert),
        }

    def client_settings(self, bootstrap: str) -> dict[str, str]:
        """``[kafka]`` keys and environment for the compactor to use the SASL_SSL listener."""
        return {
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "KAFKA_SASL_USERNAME": self.username,
            "KAFKA_SASL_PASSWORD": self.password,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "ssl_cafile": str(self.ca.cert),
        }
