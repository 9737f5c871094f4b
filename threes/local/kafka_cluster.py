"""The shape of the local Kafka cluster: how many KRaft brokers, and the ports of each.

One broker is the default (``threes local up``); ``threes local up --brokers 3`` runs three,
each a combined broker + controller (``process.roles=broker,controller``) with its own data
folder (``.threes/kafka``, ``.threes/kafka-2``, ``.threes/kafka-3``), log and PID record;
the three controllers form the KRaft quorum, so any one node may be down.

Node ``n`` (1-based) listens on three consecutive ports from ``port + 10 * (n - 1)``:
PLAINTEXT, CONTROLLER and SASL_SSL (node 1: 19092, 19093, 19094; node 2: 19102...).
The shape is recorded in ``.threes/kafka/cluster.json`` by ``up``; ``status``, ``down``,
``env`` and a later plain ``up`` read it, so a three-broker stack stays three brokers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .common import HOST, Layout, LocalStackError

KAFKA_PORT = 19092
"""PLAINTEXT port of node 1 (the default cluster's bootstrap)."""
CONTROLLER_PORT = KAFKA_PORT + 1
SASL_SSL_PORT = KAFKA_PORT + 2
PORT_STEP = 10
"""Distance between the ports of two consecutive nodes."""
MAX_BROKERS = 9


@dataclass(frozen=True)
class KafkaCluster:
    """How many brokers the local Kafka runs and where they listen.

    Attributes:
        brokers: Number of nodes, each a broker and a KRaft controller (1..9).
        port: PLAINTEXT port of node 1; node ``n``'s ports start at ``port + 10 * (n - 1)``.
    """

    brokers: int = 1
    port: int = KAFKA_PORT

    def __post_init__(self) -> None:
        if not 1 <= self.brokers <= MAX_BROKERS:
            raise LocalStackError(f"--brokers must be between 1 and {MAX_BROKERS}, not {self.brokers}")

    @property
    def nodes(self) -> range:
        """Node ids, 1-based (``node.id`` of each broker)."""
        return range(1, self.brokers + 1)

    def plaintext_port(self, node: int) -> int:
        """PLAINTEXT listener of ``node`` (clients without security, inter-broker traffic)."""
        return self.port + PORT_STEP * (node - 1)

    def controller_port(self, node: int) -> int:
        """CONTROLLER listener of ``node`` (the KRaft quorum)."""
        return self.plaintext_port(node) + 1

    def sasl_ssl_port(self, node: int) -> int:
        """SASL_SSL (SCRAM-SHA-512) listener of ``node``."""
        return self.plaintext_port(node) + 2

    def bootstrap(self) -> str:
        """``bootstrap.servers`` naming every broker's PLAINTEXT listener."""
        return ",".join(f"{HOST}:{self.plaintext_port(n)}" for n in self.nodes)

    def sasl_bootstrap(self) -> str:
        """``bootstrap.servers`` naming every broker's SASL_SSL listener."""
        return ",".join(f"{HOST}:{self.sasl_ssl_port(n)}" for n in self.nodes)

    def voters(self) -> str:
        """``controller.quorum.voters``: every node's id and controller address."""
        return ",".join(f"{n}@{HOST}:{self.controller_port(n)}" for n in self.nodes)

    def service_name(self, node: int) -> str:
        """Name of node ``node``'s service, folder, log and PID record (``kafka``, ``kafka-2``...)."""
        return "kafka" if node == 1 else f"kafka-{node}"

    @staticmethod
    def record(layout: Layout) -> Path:
        """The file holding the cluster's shape (``.threes/kafka/cluster.json``)."""
        return layout.service_dir("kafka") / "cluster.json"

    @classmethod
    def load(cls, layout: Layout) -> KafkaCluster:
        """The recorded shape; one broker on the default ports when none was recorded."""
        try:
            data = json.loads(cls.record(layout).read_text())
            return cls(int(data["brokers"]), int(data["port"]))
        except (OSError, ValueError, KeyError, TypeError):
            return cls()

    def save(self, layout: Layout) -> None:
        """Record this shape (atomically)."""
        path = self.record(layout)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"brokers": self.brokers, "port": self.port}))
        tmp.replace(path)
