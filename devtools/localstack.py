"""A real Kafka broker, or a cluster of them (KRaft), on loopback, without Docker.

Why this exists: the service's contract with Kafka (keyed partitioning,
consumer-group rebalances, offsets, exactly-once) is exactly what mocks get
wrong, and neither CI nor developer machines here have a Docker engine. The
broker's jars come from Maven Central through ``devtools/kafka/pom.xml``, are
cached per Kafka version, and the broker runs as a plain ``java`` child
process with its data under a directory the caller owns, so several brokers
(parallel test sessions, ``dev up``) never share ports or files.

In-process::

    with start_kafka(tmp_path / "kafka") as broker:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)

From a shell (CI), in the background; prints ``KAFKA_BOOTSTRAP=127.0.0.1:PORT``
once clients can connect and stops the broker on SIGTERM or SIGINT::

    python -m devtools.localstack jars            # resolve the jars, print lib dir
    python -m devtools.localstack kafka --data-dir var/kafka --ready-file var/kafka.env &
    python -m devtools.localstack kafka --brokers 3 --data-dir var/kafka3 &   # a cluster

This module is that command line and the one place callers import from; the
work is done by one module per job:

* ``kafka_jars``: ``java`` and ``mvn`` found, the pom read, the jars resolved;
* ``kafka_broker``: one broker (``KafkaBroker``, ``start_kafka``), configured
  by ``kafka_config``;
* ``kafka_cluster``: three KRaft nodes (``KafkaCluster``, ``start_cluster``),
  any of which can be killed, stopped and restarted on its ports and data;
* ``kafka_secure``: the ``--secure`` TLS and SASL listeners (``SecureBroker``);
* ``processes``: free ports, pids, stopping a process, parent death;
* ``kafka_errors``: what can go wrong.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from devtools.kafka_broker import (
    DEFAULT_HEAP_OPTS,
    DEFAULT_JVM_OPTS,
    NODE_ID,
    KafkaBroker,
    new_cluster_id,
    start_kafka,
)
from devtools.kafka_cluster import CLUSTER_JVM_OPTS, CLUSTER_NODES, KafkaCluster, start_cluster
from devtools.kafka_errors import (
    BrokerStartError,
    KafkaPomNotFoundError,
    LocalStackError,
    MissingToolError,
)
from devtools.kafka_jars import (
    KAFKA_LOG4J_CONFIG,
    KAFKA_POM_ENV,
    PACKAGED_KAFKA_POM,
    default_jars_dir,
    ensure_kafka_jars,
    find_java,
    find_kafka_pom,
    find_mvn,
    jars_ready,
    kafka_version,
)
from devtools.kafka_secure import SecureBroker
from devtools.processes import free_port, free_ports, stop_process

__all__ = [
    "CLUSTER_JVM_OPTS",
    "CLUSTER_NODES",
    "DEFAULT_HEAP_OPTS",
    "DEFAULT_JVM_OPTS",
    "KAFKA_LOG4J_CONFIG",
    "KAFKA_POM_ENV",
    "NODE_ID",
    "PACKAGED_KAFKA_POM",
    "BrokerStartError",
    "KafkaBroker",
    "KafkaCluster",
    "KafkaPomNotFoundError",
    "LocalStackError",
    "MissingToolError",
    "SecureBroker",
    "default_jars_dir",
    "ensure_kafka_jars",
    "find_java",
    "find_kafka_pom",
    "find_mvn",
    "free_port",
    "free_ports",
    "jars_ready",
    "kafka_version",
    "main",
    "new_cluster_id",
    "start_cluster",
    "start_kafka",
    "stop_process",
]


def _stop_on_signal() -> threading.Event:
    """Set on SIGTERM, SIGINT or SIGHUP: the foreground run then stops its brokers."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    return stop


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _watch(
    stop: threading.Event, nodes: Sequence[KafkaBroker], died: Callable[[KafkaBroker], str]
) -> int:
    """Until ``stop``: 0, or 1 as soon as a node dies (``died`` says so)."""
    while not stop.wait(0.5):
        for node in nodes:
            if not node.is_running():
                _note(died(node))
                return 1
    return 0


def _secure_lines(broker: KafkaBroker, secure: SecureBroker) -> str:
    """Where a client of a ``--secure`` broker finds what it needs; the passwords stay
    in users.json (0600): clients get told where."""
    return (
        f"\nKAFKA_SECURITY_PROTOCOL=SASL_SSL\nKAFKA_SSL_CAFILE={secure.ca.cert}"
        f"\nKAFKA_SASL_USERNAME={secure.username}"
        f"\nKAFKA_SASL_PASSWORD_FILE={secure.directory / 'users.json'}"
        f"\nKAFKA_SSL_BOOTSTRAP={broker.ssl_bootstrap_servers}"
    )


def _run_foreground(args: argparse.Namespace) -> int:
    stop = _stop_on_signal()
    if args.brokers > 1:
        return _run_cluster_foreground(args, stop)
    started = time.monotonic()
    secure = SecureBroker.create(Path(args.data_dir) / "tls") if args.secure else None
    broker = start_kafka(
        Path(args.data_dir),
        args.port,
        args.controller_port,
        num_partitions=args.partitions,
        ready_timeout=args.ready_timeout,
        secure=secure,
    )
    try:
        line = f"KAFKA_BOOTSTRAP={broker.bootstrap_servers}"
        if secure is not None:
            line += _secure_lines(broker, secure)
        _write_ready_file(args.ready_file, f"{line}\nKAFKA_PID={broker.pid}\n")
        print(line, flush=True)
        _note(
            f"kafka ready in {time.monotonic() - started:.1f}s "
            f"(pid {broker.pid}, log {broker.log_path})"
        )
        return _watch(stop, [broker], lambda node: f"kafka broker died:\n{node.log_tail()}")
    finally:
        broker.stop()
        if args.ready_file:
            Path(args.ready_file).unlink(missing_ok=True)


def _write_ready_file(path: str | None, text: str) -> None:
    if not path:
        return
    ready = Path(path)
    ready.parent.mkdir(parents=True, exist_ok=True)
    tmp = ready.with_name(f".{ready.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, ready)


def _run_cluster_foreground(args: argparse.Namespace, stop: threading.Event) -> int:
    """``kafka --brokers N``: a cluster until SIGTERM/SIGINT; exits 1 if a node dies."""
    if args.secure or args.port is not None or args.controller_port is not None:
        raise LocalStackError("--brokers > 1 takes neither --secure nor fixed ports")
    started = time.monotonic()
    cluster = start_cluster(
        Path(args.data_dir),
        args.brokers,
        num_partitions=args.partitions,
        ready_timeout=args.ready_timeout,
    )
    try:
        line = f"KAFKA_BOOTSTRAP={cluster.bootstrap_servers}"
        pids = ",".join(str(node.pid) for node in cluster.nodes)
        _write_ready_file(args.ready_file, f"{line}\nKAFKA_PIDS={pids}\n")
        print(line, flush=True)
        _note(
            f"kafka cluster of {args.brokers} ready in {time.monotonic() - started:.1f}s "
            f"(pids {pids}, logs {cluster.data_dir}/node-*/broker.log)"
        )
        return _watch(
            stop, cluster.nodes, lambda node: f"kafka node {node.node_id} died:\n{node.log_tail()}"
        )
    finally:
        cluster.stop()
        if args.ready_file:
            Path(args.ready_file).unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.localstack", description="Local Kafka for tests and dev."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("jars", help="resolve the broker jars (Maven) and print their folder")
    kafka = sub.add_parser("kafka", help="run a broker in the foreground until SIGTERM/SIGINT")
    kafka.add_argument("--data-dir", required=True, help="broker files; reused across runs")
    kafka.add_argument("--port", type=int, default=None, help="client port (default: free)")
    kafka.add_argument("--controller-port", type=int, default=None)
    kafka.add_argument("--partitions", type=int, default=4, help="num.partitions")
    kafka.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="nodes (KRaft, each broker and controller); 3: replication factor 3, "
        "min.insync.replicas 2",
    )
    kafka.add_argument("--ready-timeout", type=float, default=90.0)
    kafka.add_argument(
        "--secure",
        action="store_true",
        help="SASL_SSL (SCRAM, PLAIN) and SSL (client certificates) listeners with a CA "
        "generated in DATA_DIR/tls, instead of PLAINTEXT",
    )
    kafka.add_argument(
        "--ready-file", default=None, help="write KAFKA_BOOTSTRAP=... here once ready"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "jars":
            print(ensure_kafka_jars())
            return 0
        return _run_foreground(args)
    except LocalStackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
