"""The local cluster's configuration, without starting a JVM.

Why: the cluster tests prove the service's promises only if the cluster is
what they say: three voters that all know each other, one cluster id, every
topic (internal ones too) with three replicas and min.insync.replicas 2, and
each node on ports of its own that survive a restart.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.localstack import CLUSTER_JVM_OPTS, KafkaBroker, KafkaCluster

pytestmark = pytest.mark.unit


def test_three_nodes_form_one_quorum_with_replicated_topics(tmp_path: Path) -> None:
    cluster = KafkaCluster(tmp_path, 3, jars_dir=tmp_path)
    props = [node.server_properties() for node in cluster.nodes]
    voters = {p["controller.quorum.voters"] for p in props}
    assert len(voters) == 1 and len(voters.pop().split(",")) == 3
    assert [p["node.id"] for p in props] == ["1", "2", "3"]
    assert len({node.cluster_id for node in cluster.nodes}) == 1
    ports = [n.port for n in cluster.nodes] + [n.controller_port for n in cluster.nodes]
    assert len(set(ports)) == 6
    for p in props:
        assert p["process.roles"] == "broker,controller"
        assert p["default.replication.factor"] == "3"
        assert p["min.insync.replicas"] == "2"
        assert p["offsets.topic.replication.factor"] == "3"
        assert p["transaction.state.log.min.isr"] == "2"
        assert p["unclean.leader.election.enable"] == "false"
    assert cluster.bootstrap_servers == ",".join(n.bootstrap_servers for n in cluster.nodes)
    assert all(n.jvm_opts[: len(CLUSTER_JVM_OPTS)] == CLUSTER_JVM_OPTS for n in cluster.nodes)
    assert cluster.node_at(cluster.nodes[1].bootstrap_servers) is cluster.nodes[1]


def test_a_single_broker_keeps_its_one_replica_defaults(tmp_path: Path) -> None:
    props = KafkaBroker(tmp_path).server_properties()
    assert props["controller.quorum.voters"].count("@") == 1
    assert (props["default.replication.factor"], props["min.insync.replicas"]) == ("1", "1")
