"""Does a Kafka broker answer at this address? One synchronous metadata request, no client.

Used before every Kafka command (``streams.cli``) and the worker
(``streams.cli.worker``), by ``dev up``/``dev status`` and by the local broker
launcher (``devtools.localstack``) to tell when a broker it started is ready.

Under TLS and SASL (``streams.kafka.security``) the probe does what a client
does: the TLS handshake with the same context (so a certificate problem is
reported as one), then the SASL handshake and authentication (PLAIN or
SCRAM-SHA-256/512), then the metadata request. aiokafka, by contrast, logs a
refused login and reports only "Unable to bootstrap", so the probe is what
gives a wrong password, an untrusted certificate or a client speaking
PLAINTEXT to a TLS listener a message that says so.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import socket
import ssl
import struct

from streams.kafka.security import PLAINTEXT, KafkaSecurity

LOOPBACK = "127.0.0.1"


def _parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    hosts: list[tuple[str, int]] = []
    for item in bootstrap.split(","):
        item = item.strip()
        if not item:
            continue
        for scheme in ("kafka://", "PLAINTEXT://", "SSL://", "SASL_SSL://", "SASL_PLAINTEXT://"):
            item = item.removeprefix(scheme)
        host, _, port = item.rpartition(":")
        hosts.append((host.strip("[]") or LOOPBACK, int(port)))
    return hosts


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        chunks += chunk
    return bytes(chunks)


class BrokerAuthenticationError(ConnectionError):
    """The broker refused the SASL mechanism or the credentials (its own words)."""


METADATA, SASL_HANDSHAKE, SASL_AUTHENTICATE = 3, 17, 36
SASL_AUTHENTICATION_FAILED, UNSUPPORTED_SASL_MECHANISM = 58, 33


def _request(
    sock: socket.socket, api_key: int, version: int, correlation: int, body: bytes
) -> bytes:
    """Send one request (header v1), return the response after its correlation id."""
    client_id = b"compactor-probe"
    header = struct.pack(">hhih", api_key, version, correlation, len(client_id)) + client_id
    request = header + body
    sock.sendall(struct.pack(">i", len(request)) + request)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    payload = _recv_exact(sock, size)
    (answered,) = struct.unpack_from(">i", payload, 0)
    if answered != correlation:
        raise ConnectionError("unexpected correlation id in the broker's response")
    return payload[4:]


def _string(payload: bytes, offset: int) -> tuple[str | None, int]:
    (length,) = struct.unpack_from(">h", payload, offset)
    offset += 2
    if length < 0:
        return None, offset
    return payload[offset : offset + length].decode(errors="replace"), offset + length


def _sasl_handshake(sock: socket.socket, mechanism: str) -> None:
    name = mechanism.encode()
    payload = _request(sock, SASL_HANDSHAKE, 1, 2, struct.pack(">h", len(name)) + name)
    (error, count) = struct.unpack_from(">hi", payload, 0)
    if error == UNSUPPORTED_SASL_MECHANISM:
        offered, offset = [], 6
        for _ in range(count):
            item, offset = _string(payload, offset)
            offered.append(item or "")
        raise BrokerAuthenticationError(
            f"the broker does not accept SASL mechanism {mechanism} "
            f"(it offers {', '.join(offered) or 'none'}): set [kafka].sasl_mechanism"
        )
    if error:
        raise BrokerAuthenticationError(f"SASL handshake refused (Kafka error {error})")


def _sasl_authenticate(sock: socket.socket, token: bytes, correlation: int) -> bytes:
    body = struct.pack(">i", len(token)) + token
    payload = _request(sock, SASL_AUTHENTICATE, 1, correlation, body)
    (error,) = struct.unpack_from(">h", payload, 0)
    message, offset = _string(payload, 2)
    if error:
        raise BrokerAuthenticationError(
            f"the broker refused the SASL login: {message or f'Kafka error {error}'}"
        )
    (length,) = struct.unpack_from(">i", payload, offset)
    return payload[offset + 4 : offset + 4 + max(length, 0)]


def _scram_login(sock: socket.socket, mechanism: str, username: str, password: str) -> None:
    """RFC 5802 (as Kafka does it: no channel binding, ``c=biws``)."""
    digest = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
    name = username.replace("=", "=3D").replace(",", "=2C")
    nonce = secrets.token_urlsafe(24)
    first_bare = f"n={name},r={nonce}"
    server_first = _sasl_authenticate(sock, f"n,,{first_bare}".encode(), 3).decode()
    fields = dict(item.split("=", 1) for item in server_first.split(","))
    if not fields.get("r", "").startswith(nonce):
        raise BrokerAuthenticationError("SCRAM: the broker's nonce does not extend ours")
    salted = hashlib.pbkdf2_hmac(
        digest, password.encode(), base64.b64decode(fields["s"]), int(fields["i"])
    )
    client_key = hmac.digest(salted, b"Client Key", digest)
    without_proof = f"c=biws,r={fields['r']}"
    auth_message = f"{first_bare},{server_first},{without_proof}".encode()
    signature = hmac.digest(hashlib.new(digest, client_key).digest(), auth_message, digest)
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True)))
    server_final = _sasl_authenticate(sock, f"{without_proof},p={proof.decode()}".encode(), 4)
    server_key = hmac.digest(salted, b"Server Key", digest)
    expected = base64.b64encode(hmac.digest(server_key, auth_message, digest)).decode()
    if server_final.decode() != f"v={expected}":
        raise BrokerAuthenticationError("SCRAM: the broker's signature does not verify")


def _login(sock: socket.socket, security: KafkaSecurity) -> None:
    mechanism = security.sasl_mechanism or "PLAIN"
    _sasl_handshake(sock, mechanism)
    username, password = security.username or "", security.secret()
    if mechanism == "PLAIN":
        _sasl_authenticate(sock, f"\0{username}\0{password}".encode(), 3)
    else:
        _scram_login(sock, mechanism, username, password)


def _connect(host: str, port: int, timeout: float, security: KafkaSecurity) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.settimeout(timeout)
    if security.ssl_context is None:
        return sock
    try:
        return security.ssl_context.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


def probe_brokers(
    host: str, port: int, timeout: float = 2.0, security: KafkaSecurity = PLAINTEXT
) -> list[tuple[int, str, int]]:
    """Ask one address for cluster metadata; returns ``(node_id, host, port)`` per broker.

    A hand-rolled Metadata v4 request rather than a client library: it is
    synchronous (usable from fixtures, CLIs and running event loops alike),
    and unlike a bare TCP connect it only succeeds once the broker is
    registered and serving, which is what "ready" has to mean. With
    ``security`` it first does the TLS handshake and the SASL login.
    """
    with _connect(host, port, timeout, security) as sock:
        if security.uses_sasl:
            _login(sock, security)
        payload = _request(sock, METADATA, 4, 1, struct.pack(">ib", 0, 0))  # no topics
    _throttle, count = struct.unpack_from(">ii", payload, 0)
    offset = 8
    brokers: list[tuple[int, str, int]] = []
    for _ in range(count):
        (node_id, host_len) = struct.unpack_from(">ih", payload, offset)
        offset += 6
        broker_host = payload[offset : offset + host_len].decode()
        offset += host_len
        (broker_port, rack_len) = struct.unpack_from(">ih", payload, offset)
        offset += 6 + max(rack_len, 0)
        brokers.append((node_id, broker_host, broker_port))
    return brokers


def _speaks_tls(host: str, port: int, timeout: float) -> bool:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            with context.wrap_socket(sock, server_hostname=host):
                return True
    except (OSError, ValueError):
        return False


def _explain(
    host: str, port: int, error: Exception, security: KafkaSecurity, timeout: float
) -> str:
    where = f"{host}:{port}"
    if isinstance(error, BrokerAuthenticationError):
        return f"{where}: {error} ({security.describe()})"
    if isinstance(error, ssl.SSLCertVerificationError):
        return (
            f"{where}: TLS certificate not trusted: {error.verify_message} "
            "(check [kafka].ssl_cafile and ssl_check_hostname)"
        )
    if isinstance(error, ssl.SSLError):
        if "BAD_CERTIFICATE" in str(error) or "CERTIFICATE_REQUIRED" in str(error):
            return (
                f"{where}: the broker refused our client certificate ({error.reason}): "
                "set [kafka].ssl_certfile / ssl_keyfile to one its CA signed"
            )
        return f"{where}: TLS handshake failed: {error} (is it a TLS listener?)"
    if isinstance(error, ConnectionRefusedError | socket.gaierror):
        return f"{where}: {error}"
    if not security.uses_tls and _speaks_tls(host, port, timeout):
        return (
            f"{where}: the listener speaks TLS but security_protocol = {security.protocol}: "
            "set [kafka].security_protocol = SSL or SASL_SSL"
        )
    if not security.uses_sasl:
        return (
            f"{where}: no metadata answer over {security.protocol} ({error or 'closed'}); "
            "a SASL listener closes the connection like this: check [kafka].security_protocol"
        )
    return f"{where}: {error}"


def broker_problem(
    bootstrap: str, timeout: float = 2.0, security: KafkaSecurity = PLAINTEXT
) -> str | None:
    """None if any bootstrap address answers with a broker; otherwise why none did."""
    problems = []
    for host, port in _parse_bootstrap(bootstrap):
        try:
            if probe_brokers(host, port, timeout, security):
                return None
            problems.append(f"{host}:{port}: no broker in the metadata")
        except (OSError, ValueError, struct.error, KeyError) as error:
            problems.append(_explain(host, port, error, security, timeout))
    return "; ".join(problems) or "no address"


def is_reachable(bootstrap: str, timeout: float = 2.0, security: KafkaSecurity = PLAINTEXT) -> bool:
    """True if any bootstrap address answers a metadata request listing a broker."""
    return broker_problem(bootstrap, timeout, security) is None
