"""Does a Kafka broker answer at this address? One synchronous metadata request, no client.

Used before every Kafka command (``streams.cli``), by ``dev up``/``dev status``
and by the local broker launcher (``devtools.localstack``) to tell when a
broker it started is ready.
"""

from __future__ import annotations

import socket
import struct

LOOPBACK = "127.0.0.1"


def _parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    hosts: list[tuple[str, int]] = []
    for item in bootstrap.split(","):
        item = item.strip()
        if not item:
            continue
        item = item.removeprefix("kafka://").removeprefix("PLAINTEXT://")
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


def probe_brokers(host: str, port: int, timeout: float = 2.0) -> list[tuple[int, str, int]]:
    """Ask one address for cluster metadata; returns ``(node_id, host, port)`` per broker.

    A hand-rolled Metadata v4 request rather than a client library: it is
    synchronous (usable from fixtures, CLIs and running event loops alike),
    and unlike a bare TCP connect it only succeeds once the broker is
    registered and serving, which is what "ready" has to mean.
    """
    client_id = b"localstack-probe"
    header = struct.pack(">hhih", 3, 4, 1, len(client_id)) + client_id
    body = struct.pack(">ib", 0, 0)  # no topics, no auto-creation
    request = header + body
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        payload = _recv_exact(sock, size)
    correlation_id, _throttle, count = struct.unpack_from(">iii", payload, 0)
    if correlation_id != 1:
        raise ConnectionError("unexpected correlation id in metadata response")
    offset = 12
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


def is_reachable(bootstrap: str, timeout: float = 2.0) -> bool:
    """True if any bootstrap address answers a metadata request listing a broker."""
    for host, port in _parse_bootstrap(bootstrap):
        try:
            if probe_brokers(host, port, timeout):
                return True
        except (OSError, ValueError, struct.error):
            continue
    return False
