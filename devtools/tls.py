"""A throwaway certificate authority and the certificates it signs, for local TLS.

Why: the secure local broker (``devtools.localstack``, ``compactor dev up
--secure``) and the PostgreSQL TLS tests need a CA a client can trust and a
server certificate naming ``localhost`` / ``127.0.0.1``, made on the spot and
never reused. Made with the ``openssl`` command line (on every machine that
has Java or PostgreSQL; no Python dependency for a dev tool). Keys are EC
P-256 in unencrypted PKCS#8 PEM, which Kafka's ``ssl.keystore.type=PEM``,
PostgreSQL and Python's ``ssl`` all read.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DAYS = 30
_KEY_ARGS = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


class TlsToolError(RuntimeError):
    """``openssl`` is missing or refused to make a certificate."""


@dataclass(frozen=True)
class Issued:
    """A certificate and its key; ``bundle`` has both (key first) for PEM keystores."""

    cert: Path
    key: Path
    bundle: Path


@dataclass(frozen=True)
class CertificateAuthority:
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    tool = shutil.which("openssl")
    if tool is None:
        raise TlsToolError("`openssl` not found on PATH (apt-get install -y openssl)")
    proc = subprocess.run(
        [tool, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        raise TlsToolError(f"openssl {args[0]} failed ({proc.returncode}): {proc.stderr.strip()}")


def make_ca(directory: Path, name: str = "compactor-dev-ca") -> CertificateAuthority:
    """A self-signed CA (``ca.pem``, ``ca.key``) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl(
        "req",
        "-x509",
        *_KEY_ARGS,
        "-keyout",
        str(key),
        "-out",
        str(cert),
        "-days",
        str(DAYS),
        "-subj",
        f"/CN={name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )
    key.chmod(0o600)
    return CertificateAuthority(cert, key)


def issue(
    ca: CertificateAuthority,
    directory: Path,
    name: str,
    *,
    dns: Sequence[str] = ("localhost",),
    ips: Sequence[str] = ("127.0.0.1",),
) -> Issued:
    """A certificate signed by ``ca`` for these names, usable by servers and clients."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key, csr = (directory / f"{name}{ext}" for ext in (".pem", ".key", ".csr"))
    request = ("req", *_KEY_ARGS, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
    _openssl(*request, cwd=directory)
    extensions = _extensions(directory / f"{name}.ext", dns, ips)
    _openssl(
        *("x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key)),
        *("-set_serial", str(secrets.randbelow(2**63) + 1), "-days", str(DAYS)),
        *("-extfile", str(extensions), "-out", str(cert)),
        cwd=directory,
    )
    key.chmod(0o600)
    bundle = directory / f"{name}-bundle.pem"
    bundle.write_text(key.read_text() + cert.read_text())
    bundle.chmod(0o600)
    csr.unlink()
    extensions.unlink()
    return Issued(cert, key, bundle)


def _extensions(path: Path, dns: Sequence[str], ips: Sequence[str]) -> Path:
    """The extension file of a leaf certificate for ``dns`` and ``ips``, servers and
    clients alike."""
    names = [f"DNS:{host}" for host in dns] + [f"IP:{ip}" for ip in ips]
    path.write_text(
        (f"subjectAltName={','.join(names)}\n" if names else "")
        + "basicConstraints=CA:FALSE\n"
        + "keyUsage=critical,digitalSignature,keyEncipherment\n"
        + "extendedKeyUsage=serverAuth,clientAuth\n"
        + "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    return path
