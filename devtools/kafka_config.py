"""A local broker's ``server.properties``: loopback only, tuned for tests.

Every node is broker and controller. Alone, replication factors and ISR
sizes are 1; in a cluster (``replication`` 3) topics default to three
replicas with ``min.insync.replicas`` 2, internal topics included, so an
acknowledged write (acks=all) survives the loss of any one node. Internal
topics get few partitions and session timeouts are short so that group joins
and failover tests finish in seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from core.settings import default_min_insync
from devtools.kafka_secure import SecureBroker
from streams.kafka.probe import LOOPBACK


class BrokerLayout(Protocol):
    """What a broker's configuration is made of (``KafkaBroker`` has it): a protocol,
    so this module does not import the broker that imports it."""

    @property
    def node_id(self) -> int: ...

    @property
    def port(self) -> int: ...

    @property
    def controller_port(self) -> int: ...

    @property
    def ssl_port(self) -> int | None: ...

    @property
    def secure(self) -> SecureBroker | None: ...

    @property
    def quorum(self) -> Sequence[tuple[int, int]]: ...

    @property
    def log_dirs(self) -> Path: ...

    @property
    def num_partitions(self) -> int: ...

    @property
    def replication(self) -> int: ...

    @property
    def extra_config(self) -> Mapping[str, str | int]: ...


#: The same for every local broker: quick to join, quick to fail over, small.
TEST_TUNING: dict[str, str | int] = {
    # Never elect a replica that missed acknowledged writes (the default,
    # stated because the cluster tests rely on it).
    "unclean.leader.election.enable": "false",
    "auto.create.topics.enable": "true",
    "delete.topic.enable": "true",
    "offsets.topic.num.partitions": 4,
    "transaction.state.log.num.partitions": 4,
    "group.initial.rebalance.delay.ms": 0,
    "group.min.session.timeout.ms": 1000,
    "group.consumer.min.session.timeout.ms": 1000,
    "group.consumer.min.heartbeat.interval.ms": 500,
    # After a crash the controller waits out the dead incarnation's
    # session before accepting the restarted broker: 9 s by default.
    "broker.session.timeout.ms": 4000,
    "broker.heartbeat.interval.ms": 500,
    # A follower that stops fetching leaves the ISR after 10 s, not 30: a
    # hung (not dead) node holds up acks=all writes that long.
    "replica.lag.time.max.ms": 10000,
    "num.network.threads": 2,
    "num.io.threads": 4,
    "num.recovery.threads.per.data.dir": 1,
    "log.segment.bytes": 16 * 1024 * 1024,
    "log.index.size.max.bytes": 1024 * 1024,
    "log.cleaner.dedupe.buffer.size": 16 * 1024 * 1024,
    "log.cleaner.threads": 1,
}


def replication_properties(replicas: int) -> dict[str, str | int]:
    """Replicas and ISR sizes of every topic, internal ones included."""
    min_isr = default_min_insync(replicas)
    return {
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
    }


def server_properties(broker: BrokerLayout) -> dict[str, str]:
    """``broker``'s configuration: its listeners, quorum and storage, then the rest."""
    voters = ",".join(f"{node}@{LOOPBACK}:{port}" for node, port in broker.quorum)
    props: dict[str, str | int] = {
        "process.roles": "broker,controller",
        "node.id": broker.node_id,
        "controller.quorum.voters": voters,
        "listeners": (
            f"PLAINTEXT://{LOOPBACK}:{broker.port},CONTROLLER://{LOOPBACK}:{broker.controller_port}"
        ),
        "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{broker.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(broker.log_dirs),
        "num.partitions": broker.num_partitions,
        **replication_properties(broker.replication),
        **TEST_TUNING,
    }
    if broker.secure is not None and broker.ssl_port is not None:
        props.update(
            broker.secure.server_properties(broker.port, broker.ssl_port, broker.controller_port)
        )
    props.update(broker.extra_config)
    return {key: str(value) for key, value in props.items()}
