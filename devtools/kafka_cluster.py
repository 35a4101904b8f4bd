"""A local Kafka cluster: ``size`` KRaft nodes on loopback, each broker and controller.

Topics get replication factor 3 and ``min.insync.replicas`` 2 by default; a
node can be killed, stopped (a controlled shutdown) and restarted on its
ports and data, which is what the cluster tests (tests/chaos) do to it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

from devtools.kafka_broker import DEFAULT_JVM_OPTS, KafkaBroker, new_cluster_id
from devtools.kafka_errors import BrokerStartError, LocalStackError
from devtools.kafka_jars import ensure_kafka_jars
from devtools.processes import free_ports

#: Nodes of the local cluster: enough for replication factor 3 with
#: min.insync.replicas 2 to keep accepting writes with one node down.
CLUSTER_NODES = 3
#: The cluster's nodes compile with C1 only: a node restarts in about half
#: the time (7 s against 13-16 s measured on two loaded cores), and the
#: cluster tests restart nodes on their critical path; a test broker's
#: throughput does not need C2.
CLUSTER_JVM_OPTS: tuple[str, ...] = (*DEFAULT_JVM_OPTS, "-XX:TieredStopAtLevel=1")


class KafkaCluster:
    """``size`` KRaft nodes on loopback, each broker and controller (combined mode).

    Why combined rather than a separate controller quorum: three JVMs instead
    of five or six on a two-core machine, and killing a node then takes a
    controller voter with it, which a separate quorum would spare; the tests
    want that harder case. With three voters the quorum, like the data
    (replication factor 3, ``min.insync.replicas`` 2), survives any one node
    down. Production runs dedicated controllers (docs/operations.md).

    Node ``i`` lives in ``data_dir/node-i`` and keeps its ports across
    restarts, so clients reconnect to the same addresses. ``kill``, ``stop``
    and ``restart`` act on one node; ``bootstrap_servers`` lists all.
    """

    def __init__(
        self,
        data_dir: Path,
        size: int = CLUSTER_NODES,
        *,
        num_partitions: int = 4,
        jars_dir: Path | None = None,
        extra_config: Mapping[str, str | int] | None = None,
        die_with_parent: bool = True,
    ) -> None:
        if size < 1:
            raise LocalStackError(f"a cluster needs at least one node, not {size}")
        self.data_dir = Path(data_dir).resolve()
        ports = free_ports(2 * size)
        quorum = [(node, ports[size + node - 1]) for node in range(1, size + 1)]
        cluster_id = new_cluster_id()
        self.nodes = [
            KafkaBroker(
                self.data_dir / f"node-{node}",
                ports[node - 1],
                controller_port,
                num_partitions=num_partitions,
                jars_dir=jars_dir,
                extra_config=extra_config,
                die_with_parent=die_with_parent,
                node_id=node,
                quorum=quorum,
                cluster_id=cluster_id,
                replication=min(size, CLUSTER_NODES),
                jvm_opts=CLUSTER_JVM_OPTS,
            )
            for node, controller_port in quorum
        ]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.bootstrap_servers for node in self.nodes)

    def node(self, node_id: int) -> KafkaBroker:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no node {node_id} in {self!r}")

    def node_at(self, address: str) -> KafkaBroker:
        """The node whose client listener is ``host:port``."""
        for node in self.nodes:
            if node.bootstrap_servers == address:
                return node
        raise KeyError(f"no node listens on {address} in {self!r}")

    @property
    def running(self) -> list[KafkaBroker]:
        return [node for node in self.nodes if node.is_running()]

    def start(self, ready_timeout: float = 180.0) -> Self:
        """Start every node that is not running, then wait for each to serve.

        A node cannot serve before a majority of the quorum is up, so all are
        launched before any is waited on. Storage is formatted in parallel
        (one short JVM per new node), the nodes launched from this thread."""
        stopped = [node for node in self.nodes if not node.is_running()]
        errors: list[BaseException] = []

        def prepare(node: KafkaBroker) -> None:
            try:
                node.prepare()
            except BaseException as error:  # re-raised below, in the caller's thread
                errors.append(error)

        threads = [threading.Thread(target=prepare, args=(node,)) for node in stopped]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        for node in stopped:  # launched from this thread (see KafkaBroker.start)
            node.start()
        for node in stopped:
            node.wait_ready(ready_timeout)
        return self

    def kill(self, node_id: int) -> KafkaBroker:
        node = self.node(node_id)
        node.kill()
        return node

    def stop(self, node_id: int | None = None, timeout: float = 30.0) -> None:
        """One node's controlled shutdown; without ``node_id``, every node at once."""
        if node_id is not None:
            self.node(node_id).stop(timeout)
            return
        # All at once: the last ones cannot hand leadership to anybody, so a
        # controlled shutdown would only wait out its timeout.
        for node in self.nodes:
            node.kill()

    def restart(self, node_id: int, ready_timeout: float = 180.0) -> KafkaBroker:
        node = self.node(node_id)
        node.start()
        return node.wait_ready(ready_timeout)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"KafkaCluster({self.bootstrap_servers}, data_dir={self.data_dir})"


def start_cluster(
    data_dir: Path,
    size: int = CLUSTER_NODES,
    *,
    num_partitions: int = 4,
    ready_timeout: float = 180.0,
    extra_config: Mapping[str, str | int] | None = None,
    die_with_parent: bool = True,
) -> KafkaCluster:
    """Start a ``size``-node cluster and wait until every node serves clients.

    Retried on new ports (fresh storage) if a port was taken between picking
    it and the JVM binding it."""
    jars = ensure_kafka_jars()
    for attempt in range(1, 4):
        cluster = KafkaCluster(
            data_dir / f"attempt-{attempt}",
            size,
            num_partitions=num_partitions,
            jars_dir=jars,
            extra_config=extra_config,
            die_with_parent=die_with_parent,
        )
        try:
            return cluster.start(ready_timeout)
        except BrokerStartError as exc:
            cluster.stop()
            if attempt == 3 or "Address already in use" not in str(exc):
                raise
        except BaseException:
            cluster.stop()
            raise
    raise AssertionError("unreachable")
