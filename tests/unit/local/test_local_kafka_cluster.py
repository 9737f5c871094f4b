"""The shape of the local Kafka cluster: ports per node, bootstrap lists, each node's server.properties."""

from __future__ import annotations

from pathlib import Path

import pytest

from threes.local.common import Layout, LocalStackError
from threes.local.endpoints import Endpoints
from threes.local.kafka import Kafka
from threes.local.kafka_cluster import KafkaCluster
from threes.local.kafka_properties import server_properties


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_one_broker_is_the_default_and_keeps_its_ports(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    assert KafkaCluster.load(layout) == KafkaCluster(1, 19092)
    props = _props(server_properties(tmp_path / "data"))
    assert props["node.id"] == "1" and props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["offsets.topic.replication.factor"] == "1" and props["min.insync.replicas"] == "1"
    assert Endpoints.local(tmp_path).kafka_bootstrap == "127.0.0.1:19092"
    assert Endpoints.local(tmp_path).kafka_sasl_bootstrap == "127.0.0.1:19094"


def test_three_brokers_each_with_its_ports_folder_and_a_shared_quorum(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    cluster = KafkaCluster(3, 29092)
    cluster.save(layout)
    assert KafkaCluster.load(layout) == cluster
    assert Endpoints.local(tmp_path).kafka_bootstrap == "127.0.0.1:29092,127.0.0.1:29102,127.0.0.1:29112"
    assert Endpoints.local(tmp_path).kafka_sasl_bootstrap == "127.0.0.1:29094,127.0.0.1:29104,127.0.0.1:29114"
    nodes = [Kafka(layout, n) for n in cluster.nodes]
    assert [node.name for node in nodes] == ["kafka", "kafka-2", "kafka-3"]
    assert [node.ports for node in nodes] == [(29092, 29093, 29094), (29102, 29103, 29104), (29112, 29113, 29114)]
    assert len({node.dir for node in nodes}) == 3 and len({node.pid_file for node in nodes}) == 3
    # no node's marker (its folder) is found in another node's command line
    assert not any(a.marker in str(b.dir) + "/" for a in nodes for b in nodes if a is not b)
    props = _props(server_properties(tmp_path / "d2", node=2, cluster=cluster))
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:29093,2@127.0.0.1:29103,3@127.0.0.1:29113"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:29102"
    for key in ("default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor"):
        assert props[key] == "3", key
    assert props["min.insync.replicas"] == "2" and props["transaction.state.log.min.isr"] == "2"


def test_two_brokers_replicate_twice_with_one_in_sync(tmp_path: Path) -> None:
    props = _props(server_properties(tmp_path, node=1, cluster=KafkaCluster(2)))
    assert props["default.replication.factor"] == "2" and props["min.insync.replicas"] == "1"


def test_the_number_of_brokers_is_bounded() -> None:
    with pytest.raises(LocalStackError, match="between 1 and 9"):
        KafkaCluster(0)
