"""Refuse unprotected connections to remote Kafka and PostgreSQL at start-up.

A broker that is not on this host, reached without TLS (``PLAINTEXT`` or
``SASL_PLAINTEXT``: every message, and with SASL PLAIN the password, in the
clear), or a remote PostgreSQL whose certificate is not verified (``sslmode``
other than ``verify-ca`` / ``verify-full``: a man in the middle reads every
conversation) stops the worker with the key to change, unless
``[service].allow_insecure_transport = true``. Loopback (127.0.0.0/8, ::1,
``localhost``) and Unix sockets are local. Runs before anything connects
(``streams.bootstrap.build_app``). See docs/security.md.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from urllib.parse import parse_qs, urlsplit

from core.settings import ConfigError, Settings

VERIFIED_SSLMODES = frozenset({"verify-ca", "verify-full"})
TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
ALLOW_KEY = "[service].allow_insecure_transport"


def is_local(host: str) -> bool:
    """Loopback, ``localhost`` or a Unix socket (a path, or no host at all)."""
    name = host.strip().strip("[]").lower()
    if not name or name.startswith("/") or name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name.split("%")[0]).is_loopback
    except ValueError:
        return False


def _host_of(address: str) -> str:
    """The host of ``host:port`` / ``[v6]:port`` / ``host``."""
    address = address.strip()
    if address.startswith("["):
        return address[1 : address.find("]")] if "]" in address else address
    if address.count(":") == 1:
        return address.split(":", 1)[0]
    return address  # a bare host, or an IPv6 address without brackets


def remote_brokers(servers: str) -> list[str]:
    return [
        host
        for host in (_host_of(part) for part in servers.split(",") if part.strip())
        if not is_local(host)
    ]


def dsn_hosts(dsn: str) -> list[str]:
    """Every host a DSN names (several for a multi-host DSN; ``host=`` too)."""
    parts = urlsplit(dsn)
    netloc = parts.netloc.rpartition("@")[2]
    hosts = [_host_of(part) for part in netloc.split(",")] if netloc else []
    for value in parse_qs(parts.query).get("host", []):
        hosts.extend(value.split(","))
    return hosts or [""]


def dsn_sslmode(dsn: str, environ: Mapping[str, str]) -> str:
    """The sslmode asyncpg uses: the DSN's, else ``$PGSSLMODE``, else ``prefer``."""
    found = parse_qs(urlsplit(dsn).query).get("sslmode")
    return found[-1] if found else environ.get("PGSSLMODE", "prefer")


def check_transport(
    settings: Settings,
    *,
    bootstrap: str | None,
    dsn: str | None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """ConfigError naming the key when a remote connection would be unprotected."""
    if settings.service.allow_insecure_transport:
        return
    env = os.environ if environ is None else environ
    kafka = settings.kafka
    if bootstrap and kafka.security_protocol not in TLS_PROTOCOLS:
        remote = remote_brokers(bootstrap)
        if remote:
            raise ConfigError(
                f"[kafka].security_protocol = {kafka.security_protocol!r} sends everything "
                f"unencrypted to the remote broker {remote[0]!r}: set [kafka].security_protocol "
                f'= "SSL" or "SASL_SSL", or set {ALLOW_KEY} = true to accept that '
                "(docs/security.md)"
            )
    if dsn:
        remote = [host for host in dsn_hosts(dsn) if not is_local(host)]
        mode = dsn_sslmode(dsn, env)
        if remote and mode not in VERIFIED_SSLMODES:
            raise ConfigError(
                f"[postgres].sslmode (or the DSN's sslmode) = {mode!r} does not verify the "
                f"remote PostgreSQL server "
                f'{remote[0]!r}: set [postgres].sslmode = "verify-full" (with '
                f"[postgres].ssl_rootcert), or set {ALLOW_KEY} = true to accept that "
                "(docs/security.md)"
            )
